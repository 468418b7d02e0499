"""Data loading for GRPO training of vision-language models.

`load_data_config` reads a YAML data config that mixes VLM-R1 JSON/JSONL files and verl/EasyR1
parquet files into one `datasets.Dataset` of TRL conversational prompts with lazily decoded images.
Invalid configs or data raise `DataConfigError`.
"""

from .config import DataConfig, DataEntry, parse_data_config
from .errors import DataConfigError
from .formats import solution_to_text
from .images import EMBEDDED_IMAGE_PATH, check_image, load_image
from .loader import load_data_config
from .prompts import IMAGE_PLACEHOLDER, build_prompt
from .sampling import SamplingStrategy, parse_sampling_strategy

__all__ = [
    "EMBEDDED_IMAGE_PATH",
    "IMAGE_PLACEHOLDER",
    "DataConfig",
    "DataConfigError",
    "DataEntry",
    "SamplingStrategy",
    "build_prompt",
    "check_image",
    "load_data_config",
    "load_image",
    "parse_data_config",
    "parse_sampling_strategy",
    "solution_to_text",
]
