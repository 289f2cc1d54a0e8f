"""qcc-hardact: an example qcc plugin contributing the `fuse-hard-activation` pass.

The entry point `qcc.plugins: hardact = qcc_hardact:PLUGIN` (see pyproject.toml) is all qcc needs.
The pass is named by a "module:attr" string so `qcc plugins` can list it without importing it.
"""

from __future__ import annotations

import qcc

__version__ = "0.1.0"

PLUGIN = qcc.Plugin(
    api_version=1,  # the qcc plugin API this was written against; qcc refuses any other
    passes={"fuse-hard-activation": "qcc_hardact.fuse:FuseHardActivation"},
)
