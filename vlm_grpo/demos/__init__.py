"""The demo tasks of `vlm-grpo demo`, one module each (its `TASK`: data, warm start, rewards), and the pipeline
they share (`common.run_task`).

- `colour`: name the colour of a square (four options, one word).
- `grounding`: box of the one object, `<think>...</think><answer>[x1, y1, x2, y2]</answer>` (`iou`, `rec_format`).
- `brand`: brand of a synthetic logo among 56 numbered options (`choice_accuracy`).
- `segments` (`--task math`): total of two segment lengths in `\\boxed{}` (`geo3k`).
"""
