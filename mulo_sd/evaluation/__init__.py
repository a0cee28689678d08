"""The evaluation layer: the batch-1 speed/quality harness (harness.py over runs.py, quality.py,
summaries.py and writers.py; docs/evaluation.md), the matched-quality table (matched_quality.py) and
sharded, resumable generation over a prompt file (generation.py, prompt_sets.py; docs/real_evaluation.md).

    from mulo_sd.decoding import SamplerConfig
    from mulo_sd.evaluation import RunSpec, evaluate, matched_quality_table
    from mulo_sd.pipeline import load_models
    from mulo_sd.testbed.prompts import evaluation_prompts

    runs = [RunSpec("ar"), RunSpec("mulo", {"r": 2})]
    result = evaluate(load_models(), runs, evaluation_prompts(8), [0], SamplerConfig(), "cpu", "out")
    table = matched_quality_table(result.summary)

The real-image metrics (real_evaluate.py, metrics/), the ranks of a multi-process run (ranks.py) and the
texture study (texture.py, texture_noise.py) are imported by their modules.
"""

from mulo_sd.evaluation.generation import GenerationCounts, gather_records, generate
from mulo_sd.evaluation.harness import Evaluation, evaluate
from mulo_sd.evaluation.matched_quality import MATCHED_COLUMNS, matched_quality_table, matched_runs
from mulo_sd.evaluation.paired import BOOTSTRAP, Bootstrap
from mulo_sd.evaluation.prompt_sets import PromptRecord, PromptSet, load_prompt_set
from mulo_sd.evaluation.runs import REFERENCE_METHOD, RunSpec, expand_runs, reference_run
from mulo_sd.evaluation.summaries import add_ratios, summarize

__all__ = [
    "BOOTSTRAP",
    "MATCHED_COLUMNS",
    "REFERENCE_METHOD",
    "Bootstrap",
    "Evaluation",
    "GenerationCounts",
    "PromptRecord",
    "PromptSet",
    "RunSpec",
    "add_ratios",
    "evaluate",
    "expand_runs",
    "gather_records",
    "generate",
    "load_prompt_set",
    "matched_quality_table",
    "matched_runs",
    "reference_run",
    "summarize",
]
