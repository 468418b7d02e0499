"""Tests of the reward registry ``vlm_grpo.rewards``."""

from __future__ import annotations

import pickle
import sys
import textwrap
import threading

import pytest

from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.rewards import (
    ACCURACY_METHODS,
    REWARDS,
    AsyncNamedReward,
    NamedReward,
    accuracy,
    box_iou,
    build_rewards,
    choice_accuracy,
    format_reward,
    geo3k,
    get_reward,
    iou,
    math_accuracy,
    rec_format,
)
from vlm_grpo.rewards.text import answer_or_text, completion_text, find_box, last_boxed, strip_answer_tag


def conv(text: str) -> list[dict]:
    """A conversational completion as TRL passes it."""
    return [{"role": "assistant", "content": text}]


def parts(text: str) -> list[dict]:
    """A conversational completion whose content is a list of typed parts."""
    half = len(text) // 2
    return [
        {
            "role": "assistant",
            "content": [{"type": "text", "text": text[:half]}, {"type": "text", "text": text[half:]}],
        }
    ]


SHAPES = [pytest.param(lambda t: t, id="str"), pytest.param(conv, id="conv"), pytest.param(parts, id="parts")]

# Extra arguments TRL 1.16 passes to every reward; all rewards must ignore them.
TRL_KWARGS = {"trainer_state": object(), "log_extra": lambda **kw: None, "log_metric": lambda *a: None}


def call(fn, completions, **kwargs):
    """Call a reward the way TRL does: keyword arguments only, with prompts and completion_ids."""
    n = len(completions)
    return fn(prompts=["p"] * n, completions=completions, completion_ids=[[1, 2]] * n, **TRL_KWARGS, **kwargs)


# --------------------------------------------------------------------------- text helpers


def test_completion_text_shapes():
    assert completion_text("abc") == "abc"
    assert completion_text(conv("abc")) == "abc"
    assert completion_text(parts("abcdef")) == "abcdef"
    image_part = [{"role": "assistant", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}]
    assert completion_text(image_part) == "x"
    multi = [
        {"role": "assistant", "content": "first"},
        {"role": "tool", "content": "t"},
        {"role": "assistant", "content": "last"},
    ]
    assert completion_text(multi) == "last"
    assert completion_text(None) == ""
    assert completion_text(conv(None)) == ""


def test_strip_answer_tag_and_answer_rules():
    assert strip_answer_tag("<answer> red </answer>") == "red"
    assert strip_answer_tag(" red ") == "red"
    assert strip_answer_tag([1, 2, 3, 4]) == [1, 2, 3, 4]
    assert answer_or_text("<think>a</think><answer> b </answer>") == "b"
    assert answer_or_text("<think>a</think> b ") == "b"
    assert answer_or_text("<answer>b") is None  # truncated answer: nothing to grade
    assert answer_or_text("<answer>a</answer><answer>b</answer>") == "b"


def test_find_box_and_last_boxed():
    assert find_box("x [1, 2.5, -3,4] y [5,6,7,8]") == [1.0, 2.5, -3.0, 4.0]
    assert find_box('{"bbox_2d": [10,20,30,40], "label": "cat"}') == [10.0, 20.0, 30.0, 40.0]
    assert find_box("[1, 2, 3]") is None
    assert find_box("[a, b, c, d]") is None
    assert last_boxed(r"\boxed{1} then \boxed{\frac{1}{\sqrt{2}}}") == r"\frac{1}{\sqrt{2}}"
    assert last_boxed(r"\boxed{1} then \boxed{unclosed") == "1"
    assert last_boxed("no box") is None


# --------------------------------------------------------------------------- format


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>r</think><answer>a</answer>", 1.0),
        ("  \n<think>\nr\n</think>\n\n<answer> a </answer>\n ", 1.0),
        ("<think></think><answer></answer>", 1.0),
        ("hello <think>r</think><answer>a</answer>", 0.0),
        ("<think>r</think><answer>a</answer> bye", 0.0),
        ("<think>r</think> text <answer>a</answer>", 0.0),
        ("<answer>a</answer><think>r</think>", 0.0),
        ("<think>r</think>", 0.0),
        ("<answer>a</answer>", 0.0),
        ("<think>r</think><answer>a</answer><answer>b</answer>", 0.0),
        ("<think>r<answer>x</answer></think><answer>a</answer>", 0.0),
        ("<think>r</think><answer>a", 0.0),
        ("", 0.0),
    ],
)
def test_format(shape, text, expected):
    assert call(format_reward, [shape(text)]) == [expected]


@pytest.mark.parametrize("shape", SHAPES)
def test_rec_format(shape):
    texts = [
        "<think>r</think><answer>[1, 2, 3, 4]</answer>",
        "<think>r</think><answer>The box is [ -1.5 ,2,30.25, 40 ] here</answer>",
        '<think>r</think><answer>{"bbox_2d": [1,2,3,4]}</answer>',
        "<think>r</think><answer>[1, 2, 3]</answer>",
        "<think>[1, 2, 3, 4]</think><answer>none</answer>",
        "<answer>[1, 2, 3, 4]</answer>",
        "[1, 2, 3, 4]",
    ]
    assert call(rec_format, [shape(t) for t in texts]) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


# --------------------------------------------------------------------------- iou


def test_box_iou_values():
    assert box_iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert box_iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    assert box_iou([0, 0, 10, 10], [10, 0, 20, 10]) == 0.0  # touching edges
    # Half overlap: inter = 5*10 = 50, union = 100 + 100 - 50 = 150.
    assert box_iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(1 / 3)
    # Contained: inter = 25, union = 100.
    assert box_iou([0, 0, 10, 10], [0, 0, 5, 5]) == pytest.approx(0.25)
    assert box_iou([0, 0, 0, 10], [0, 0, 10, 10]) == 0.0  # degenerate, x2 == x1
    assert box_iou([10, 10, 0, 0], [0, 0, 10, 10]) == 0.0  # inverted


@pytest.mark.parametrize("shape", SHAPES)
def test_iou_absolute(shape):
    texts = [
        "<think>r</think><answer>[0, 0, 10, 10]</answer>",
        "<think>r</think><answer>[5,0,15,10]</answer>",
        "<think>r</think><answer>[20, 20, 30, 30]</answer>",
        "<think>r</think><answer>no box</answer>",
        "<think>[0, 0, 10, 10]</think><answer>none</answer>",  # box only in the reasoning: not graded
        "<think>[20, 20, 30, 30]</think> [0, 0, 10, 10]",  # no <answer>: text outside <think> is graded
        "[0.0, 0.0, 5.0, 5.0]",
        "<think>r</think><answer>[0, 0, 10, 10]",  # truncated answer
    ]
    solution = [[0, 0, 10, 10]] * len(texts)
    rewards = call(iou, [shape(t) for t in texts], solution=solution)
    assert rewards == pytest.approx([1.0, 1 / 3, 0.0, 0.0, 0.0, 1.0, 0.25, 0.0])


def test_iou_solution_forms_and_none():
    completions = ["<answer>[0, 0, 10, 10]</answer>"] * 4
    solution = ["<answer>[0, 0, 10, 10]</answer>", "[5, 0, 15, 10]", (0, 0, 10, 10), None]
    assert call(iou, completions, solution=solution) == pytest.approx([1.0, 1 / 3, 1.0, None])
    with pytest.raises(ValueError, match="expected a box"):
        call(iou, completions[:1], solution=["no box here"])
    with pytest.raises(ValueError, match="'solution'"):
        call(iou, completions[:1])


def test_iou_resized():
    # The model saw a 500x250 image; the original is 1000x1000: x doubles, y quadruples.
    completions = [conv("<answer>[0, 0, 50, 25]</answer>"), "<answer>[0, 0, 50, 25]</answer>"]
    rewards = call(
        iou,
        completions,
        coords="resized",
        solution=[[0, 0, 100, 100], [0, 0, 50, 25]],
        image_size=[[1000, 1000], [1000, 1000]],
        model_image_size=[[500, 250], [500, 250]],
    )
    # Second: predicted [0, 0, 100, 100] vs [0, 0, 50, 25] -> 1250 / 10000.
    assert rewards == pytest.approx([1.0, 0.125])
    # Without rescaling the same completion scores differently.
    assert call(iou, completions[:1], solution=[[0, 0, 100, 100]]) == pytest.approx([0.125])


def test_iou_norm1000():
    completions = ["<answer>[250, 500, 500, 1000]</answer>", conv("<answer>[0, 0, 1000, 1000]</answer>")]
    rewards = call(
        iou,
        completions,
        coords="norm1000",
        solution=[[100, 100, 200, 200], [0, 0, 400, 200]],
        image_size=[[400, 200], [400, 200]],
    )
    assert rewards == pytest.approx([1.0, 1.0])


def test_iou_missing_columns_and_bad_option():
    completions = ["<answer>[0, 0, 1, 1]</answer>"]
    with pytest.raises(ValueError, match="'image_size'"):
        call(iou, completions, coords="norm1000", solution=[[0, 0, 1, 1]])
    with pytest.raises(ValueError, match="'model_image_size'"):
        call(iou, completions, coords="resized", solution=[[0, 0, 1, 1]], image_size=[[10, 10]])
    with pytest.raises(ValueError, match="'image_size'.*position 0"):
        call(iou, completions, coords="norm1000", solution=[[0, 0, 1, 1]], image_size=[None])
    with pytest.raises(ValueError, match="absolute, resized, norm1000"):
        call(iou, completions, coords="pixels", solution=[[0, 0, 1, 1]])


# --------------------------------------------------------------------------- choice_accuracy

COLORS = ["red", "green", "blue"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("red", 1.0),
        (" Red. ", 1.0),
        ("RED", 1.0),
        ("<think>..</think><answer>red</answer>", 1.0),
        ("<think>maybe green</think>red", 1.0),
        ("red or green", 0.0),
        ("red green blue", 0.0),
        ("red, green, blue", 0.0),
        ("Red, Green, Blue", 0.0),
        ("", 0.0),
        ("<answer></answer>", 0.0),
        ("<think>red</think><answer></answer>", 0.0),
        ("reddish", 0.0),
        ("green", 0.0),
        ("The answer is red", 0.0),
        ("<answer>red", 0.0),
        ("<answer>red</answer><answer>green</answer>", 0.0),  # the last answer counts
        ("A", 1.0),  # label of options[0]
        ("(a)", 1.0),
        ("A. red", 1.0),
        ("A. green", 0.0),  # label and text disagree
        ("B", 0.0),
        ("D", 0.0),  # no fourth option
        ("A B", 0.0),
    ],
)
def test_choice_accuracy_hacking(shape, text, expected):
    assert call(choice_accuracy, [shape(text)], solution=["red"], options=[COLORS]) == [expected]


def test_choice_accuracy_labels_solution_and_options():
    # Solution given as a label, options as texts.
    assert call(choice_accuracy, ["green", "B", "b)", "red"], solution=["B"] * 4, options=[COLORS] * 4) == [
        1.0,
        1.0,
        1.0,
        0.0,
    ]
    # Solution wrapped in <answer>.
    assert call(choice_accuracy, ["blue"], solution=["<answer>Blue</answer>"], options=[COLORS]) == [1.0]
    # Labels off: letters name nothing, and a letter solution is an error.
    assert call(choice_accuracy, ["A"], solution=["red"], options=[COLORS], labels=False) == [0.0]
    with pytest.raises(ValueError, match="none of its options"):
        call(choice_accuracy, ["red"], solution=["A"], options=[COLORS], labels=False)
    # An option whose text is a letter wins over the position label.
    assert call(choice_accuracy, ["A"], solution=["A"], options=[["B", "A"]]) == [1.0]
    assert call(choice_accuracy, ["B"], solution=["A"], options=[["B", "A"]]) == [0.0]
    # More than 26 options (brands): no labels.
    brands = [f"brand {i}" for i in range(120)]
    assert call(
        choice_accuracy,
        ["Brand 7", "A", "brand 7 or brand 8"],
        solution=["brand 7"] * 3,
        options=[brands] * 3,
    ) == [
        1.0,
        0.0,
        0.0,
    ]
    # Each record has its own options.
    assert call(
        choice_accuracy,
        ["nike", "nike"],
        solution=["Nike", "Puma"],
        options=[["Nike", "Adidas"], ["Puma", "Nike"]],
    ) == [
        1.0,
        0.0,
    ]
    # A record without a solution: the reward does not apply.
    assert call(choice_accuracy, ["red"], solution=[None], options=[COLORS]) == [None]


def test_choice_accuracy_errors():
    with pytest.raises(ValueError, match="column 'options'"):
        call(choice_accuracy, ["red"], solution=["red"])
    with pytest.raises(ValueError, match="'options'.*position 1"):
        call(choice_accuracy, ["red", "red"], solution=["red", "red"], options=[COLORS, None])
    with pytest.raises(ValueError, match="expected a list of the option texts"):
        call(choice_accuracy, ["red"], solution=["red"], options=["red, green"])
    with pytest.raises(ValueError, match="none of its options"):
        call(choice_accuracy, ["red"], solution=["purple"], options=[COLORS])


# --------------------------------------------------------------------------- math


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    ("text", "sol", "expected"),
    [
        (r"<think>r</think> so \boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{2\sqrt{3}}", r"2\sqrt{3}", 1.0),
        (r"\boxed{\sqrt{12}}", r"2\sqrt{3}", 1.0),
        (r"\boxed{3}", r"2\sqrt{3}", 0.0),
        (r"<think>r</think><answer>$\frac{1}{2}$</answer>", "<answer>0.5</answer>", 1.0),
        (r"first \boxed{1} then \boxed{\frac{3}{4}}", r"\frac{3}{4}", 1.0),
        (r"first \boxed{3/4} then \boxed{1}", r"\frac{3}{4}", 0.0),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}", 1.0),  # nested braces
        (r"\boxed{60^\circ}", "60", 1.0),
        ("<answer>The answer is 5</answer>", "5", 0.0),  # the whole answer is graded, not a number in it
        ("<answer>3 or 5</answer>", "5", 0.0),
        ("the answer is 5", "5", 0.0),  # nothing to grade
        ("<answer>Yes.</answer>", "yes", 1.0),
        ("<answer>sey</answer>", "yes", 0.0),  # words are not products of symbols
        (r"\boxed{12}", r"\boxed{12}", 1.0),
        (r"\boxed{}", "0", 0.0),
    ],
)
def test_math_accuracy(shape, text, sol, expected):
    assert call(math_accuracy, [shape(text)], solution=[sol]) == [expected]


def test_math_accuracy_numeric_solution_none_and_thread():
    assert call(math_accuracy, [r"\boxed{2}", r"\boxed{2}"], solution=[2, None]) == [1.0, None]
    results: list = []
    worker = threading.Thread(target=lambda: results.append(math_accuracy([r"\boxed{1/2}"], ["0.5"])))
    worker.start()
    worker.join()
    assert results == [[1.0]]
    with pytest.raises(ValueError, match="'solution'"):
        call(math_accuracy, [r"\boxed{1}"])


@pytest.mark.parametrize("shape", SHAPES)
def test_geo3k(shape):
    texts = [
        r"<think>r</think> The answer is \boxed{5}.",  # right and formatted
        r"<think>r</think> \boxed{4}",  # wrong, formatted
        r"\boxed{5}",  # right, no <think>
        "<think>r</think> 5",  # wrong (nothing to grade), no box
        r"<think>\boxed{5}</think> five",  # box only inside <think>: right, not formatted
        r"  <think>r</think><answer>\boxed{5}</answer>",
        r"<think>r \boxed{4}</think> \boxed{5}",  # last box graded
    ]
    rewards = call(geo3k, [shape(t) for t in texts], solution=["5"] * len(texts))
    assert rewards == pytest.approx([1.0, 0.1, 0.9, 0.0, 0.9, 1.0, 1.0])
    assert call(geo3k, [r"<think>r</think>\boxed{5}"], solution=[None]) == [None]


# --------------------------------------------------------------------------- accuracy dispatch


def test_accuracy_dispatch():
    completions = [
        "<answer>[0, 0, 10, 10]</answer>",
        conv("<answer>green</answer>"),
        r"\boxed{\frac{1}{2}}",
        r"<think>r</think>\boxed{3}",
        "<answer>B</answer>",
        r"<answer>0.5</answer>",
        "<answer>red</answer>",
    ]
    rewards = call(
        accuracy,
        completions,
        solution=[[5, 0, 15, 10], "green", "0.5", "3", "<answer>B</answer>", "1/2", "blue"],
        accu_reward_method=["iou", "choice_accuracy", "math_accuracy", "geo3k", "mcq", "math", "choice"],
        options=[None, COLORS, None, None, COLORS, None, COLORS],
    )
    assert rewards == pytest.approx([1 / 3, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0])


def test_accuracy_default_and_bound_options():
    # Missing column: the 'default' option decides; bound options reach the method.
    rewards = call(
        accuracy,
        ["<answer>[0, 0, 500, 500]</answer>"],
        solution=[[0, 0, 100, 50]],
        image_size=[[200, 100]],
        default="rec",
        coords="norm1000",
    )
    assert rewards == pytest.approx([1.0])
    # None for one record uses the default; the name 'default' without the option means math_accuracy.
    assert call(
        accuracy,
        [r"\boxed{2}", r"\boxed{2}", r"\boxed{3}"],
        solution=["2", "2", "2"],
        accu_reward_method=[None, "default", "default"],
        default="math",
    ) == [1.0, 1.0, 0.0]
    assert call(accuracy, [r"\boxed{2}"], solution=["2"], accu_reward_method=["default"]) == [1.0]
    assert call(accuracy, ["x"], solution=[None], accu_reward_method=["math"]) == [None]


def test_accuracy_errors():
    with pytest.raises(ValueError, match="accu_reward_method.*default"):
        call(accuracy, [r"\boxed{2}"], solution=["2"])
    with pytest.raises(ValueError, match="accu_reward_method.*default"):
        call(accuracy, [r"\boxed{2}"], solution=["2"], accu_reward_method=[None])
    with pytest.raises(ValueError, match="unknown accu_reward_method 'od_ap'.*iou.*choice_accuracy.*mcq"):
        call(accuracy, [r"\boxed{2}"], solution=["2"], accu_reward_method=["od_ap"])
    with pytest.raises(ValueError, match="unknown accu_reward_method 'maths'"):
        call(accuracy, [r"\boxed{2}"], solution=["2"], default="maths")
    with pytest.raises(ValueError, match="column 'options'"):
        call(accuracy, ["red"], solution=["red"], accu_reward_method=["mcq"])
    assert set(ACCURACY_METHODS) == {"iou", "choice_accuracy", "math_accuracy", "geo3k"}


# --------------------------------------------------------------------------- registry


def test_get_reward_names_and_options():
    for name in REWARDS:
        assert get_reward(name).__name__ == name
    fn = get_reward("iou", coords="norm1000")
    assert isinstance(fn, NamedReward)
    rewards = call(
        fn, ["<answer>[0, 0, 500, 500]</answer>"], solution=[[0, 0, 50, 50]], image_size=[[100, 100]]
    )
    assert rewards == pytest.approx([1.0])
    # The same reward unbound compares absolute coordinates.
    assert call(
        get_reward("iou"), ["<answer>[0, 0, 500, 500]</answer>"], solution=[[0, 0, 50, 50]]
    ) == pytest.approx([0.01])
    clone = pickle.loads(pickle.dumps(fn))
    assert clone.__name__ == "iou" and clone.options == {"coords": "norm1000"}


def test_get_reward_unknown_name_lists_builtins():
    with pytest.raises(ValueError) as info:
        get_reward("iuo")
    message = str(info.value)
    assert "'iuo'" in message
    for name in REWARDS:
        assert name in message


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    """A temporary module ``my_rewards_mod`` with user reward functions, importable for the test."""
    (tmp_path / "my_rewards_mod.py").write_text(
        textwrap.dedent(
            """
            NOT_CALLABLE = 3

            def length_reward(completions, scale=1.0, **kwargs):
                return [scale * len(c if isinstance(c, str) else c[0]["content"]) for c in completions]

            async def async_reward(completions, **kwargs):
                return [1.0 for _ in completions]

            def strict_reward(completions, solution=None, scale=1.0):
                return [scale for _ in completions]
            """
        )
    )
    (tmp_path / "broken_rewards_mod.py").write_text("import a_dependency_that_does_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("my_rewards_mod", "broken_rewards_mod"):
        sys.modules.pop(name, None)


def test_build_rewards(user_rewards):
    specs = [
        {"name": "iou", "weight": 1.0},
        {"name": "rec_format", "weight": 0.5},
        {"name": "my_rewards_mod.length_reward", "scale": 2},
        "format",
        {"name": "iou", "coords": "norm1000", "weight": 2},
    ]
    funcs, weights = build_rewards(specs)
    assert weights == [1.0, 0.5, 1.0, 1.0, 2.0]
    assert all(isinstance(w, float) for w in weights)
    assert [f.__name__ for f in funcs] == ["iou", "rec_format", "length_reward", "format", "iou_2"]
    assert funcs[4].options == {"coords": "norm1000"}
    assert call(funcs[2], ["abc", conv("abcd")]) == [6.0, 8.0]
    text = "<think>r</think><answer>[0, 0, 10, 10]</answer>"
    assert call(funcs[1], [text]) == [1.0]
    assert call(funcs[3], [text]) == [1.0]
    assert build_rewards([]) == ([], [])
    assert build_rewards(None) == ([], [])


def test_build_rewards_async_user_function(user_rewards):
    import asyncio
    import inspect

    (fn,), _ = build_rewards(["my_rewards_mod.async_reward"])
    assert isinstance(fn, AsyncNamedReward)
    assert inspect.iscoroutinefunction(type(fn).__call__)
    assert asyncio.run(fn(completions=["a", "b"], solution=[None, None])) == [1.0, 1.0]


def test_build_rewards_errors(user_rewards):
    with pytest.raises(ValueError, match="Built-in rewards: format, rec_format, iou"):
        build_rewards([{"name": "nope"}])
    with pytest.raises(ValueError, match="cannot import module 'no_such_pkg.mod'"):
        build_rewards(["no_such_pkg.mod.fn"])
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        build_rewards(["my_rewards_mod.missing"])
    with pytest.raises(ValueError, match="not a callable"):
        build_rewards(["my_rewards_mod.NOT_CALLABLE"])
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_does_not_exist"):
        build_rewards(["broken_rewards_mod.fn"])  # the user's own import error is not hidden
    with pytest.raises(ValueError, match="weight must be a finite number"):
        build_rewards([{"name": "iou", "weight": "high"}])
    with pytest.raises(ValueError, match="weight must be a finite number"):
        build_rewards([{"name": "iou", "weight": True}])
    with pytest.raises(ValueError, match="has no 'name'"):
        build_rewards([{"weight": 1.0}])
    with pytest.raises(ValueError, match="must be a name or a mapping"):
        build_rewards([3])
    with pytest.raises(ValueError, match="must be a list"):
        build_rewards("format")


def test_reward_entry_keys_must_be_keywords_of_the_reward(user_rewards):
    with pytest.raises(VLMGRPOError, match=r"reward 'iou': unknown key 'wieght' \(did you mean 'weight'\?\)"):
        build_rewards([{"name": "iou", "wieght": 2}])
    with pytest.raises(VLMGRPOError, match=r"reward 'iou': unknown key 'coord' \(did you mean 'coords'\?\)"):
        build_rewards([{"name": "iou", "coord": "norm1000"}])
    with pytest.raises(VLMGRPOError, match="reward 'format': unknown key 'strict'"):
        build_rewards(
            [{"name": "format", "strict": True}]
        )  # built-ins take **kwargs only for dataset columns
    with pytest.raises(VLMGRPOError, match=r"'my_rewards_mod.strict_reward': unknown key 'scal' .*'scale'"):
        build_rewards([{"name": "my_rewards_mod.strict_reward", "scal": 2}])
    with pytest.raises(VLMGRPOError, match="unknown key 'sale'"):
        get_reward("iou", sale=1)
    (fn,), _ = build_rewards([{"name": "my_rewards_mod.strict_reward", "scale": 2}])
    assert fn.options == {"scale": 2}
    (fn,), _ = build_rewards([{"name": "iou", "coords": "norm1000", "weight": 2}])
    assert fn.options == {"coords": "norm1000"}
    (fn,), _ = build_rewards([{"name": "my_rewards_mod.length_reward", "anything": 1}])  # **kwargs takes any
    assert fn.options == {"anything": 1}


def test_rewards_package_stays_light():
    import subprocess

    code = (
        "import sys, vlm_grpo.rewards as r; r.get_reward('format')(completions=['x']); "
        "heavy = [m for m in ('torch', 'transformers', 'trl') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
