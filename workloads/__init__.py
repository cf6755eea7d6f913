"""Workloads: request traces (real and synthetic), loaders, generators, transforms."""

from workloads.bundled import BUNDLED, load_bundled
from workloads.formats.inference_perf import ConfigError, read_inference_perf
from workloads.formats.loaders import FORMATS, detect_format, load_trace
from workloads.formats.writers import save_trace
from workloads.sessions import Seconds, SessionSpec
from workloads.sources import open_trace
from workloads.summary import TraceSummary, format_summary, summarize
from workloads.synthetic.arrivals import Stage, gamma_arrivals_s, poisson_arrivals_s
from workloads.synthetic.generators import SyntheticSpec, generate_trace
from workloads.synthetic.lengths import Empirical, Fixed, LengthDist, LogNormal, Pareto, Uniform
from workloads.synthetic.spec import SPEC_HELP, SpecError, is_synthetic_spec, parse_spec
from workloads.trace import PREFIX_BLOCK_TOKENS, SessionColumns, Trace
from workloads.transforms import (
    TraceTransforms,
    clip_lengths,
    head,
    scale_lengths,
    scale_qps,
    time_window,
    with_hash_block_tokens,
)
from workloads.validate import TraceError
