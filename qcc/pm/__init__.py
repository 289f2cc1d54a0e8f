"""Pass manager: passes, analyses, pipeline specs, instruments."""

from qcc.pm.base import ALL, Analysis, AnalysisManager, OptionInfo, Pass, PassContext, PassResult
from qcc.pm.instruments import DumpIR, Instrument, PrintAfterAll, TimePasses
from qcc.pm.manager import PassManager, build_passes, check_order
from qcc.pm.spec import PassSpec, format_spec, parse_spec

__all__ = [
    "ALL", "Analysis", "AnalysisManager", "DumpIR", "Instrument", "OptionInfo", "Pass", "PassContext",
    "PassManager", "PassResult", "PassSpec", "PrintAfterAll", "TimePasses", "build_passes",
    "check_order", "format_spec", "parse_spec",
]
