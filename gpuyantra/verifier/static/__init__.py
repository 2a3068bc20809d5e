"""Layer 1: static analysis of the candidate's AST, before any of it runs.

The checker reads the source once (the sandbox later runs a copy of exactly that text) and reports
every rule it breaks. It is conservative: every load of a torch attribute anywhere in host code is
checked against a small allowlist (allocation and metadata), so a reference stored in a list, a
default argument or a dict is caught where it is taken, not where it is called. Import aliases and
`getattr(module, "literal")` resolve to dotted paths; any other way to reach a module object
(passing `torch` around as a value, computed getattr names, dunders, frames) is itself a failure.

The package, each module importing only those listed above it:

- `tables`: the names the rules judge against (allowed modules and torch attributes, tensor
  methods, builtins, forbidden prefixes);
- `report`: `StaticReport` and `EntryInfo`, what the layer hands to the contract layer;
- `scopes`: AST walks that stay inside one function, and `_Func`, the per-function facts;
- `base`: the checker's state and reporting, imports, and dotted-path resolution and rules;
- `module_level`: what the module binds at top level, and OP, ADAPTER and entry read as literals;
- `nodes`: the walk over every node with the context it runs in (module, host or kernel);
- `taint`: which host names hold tensors, and operators applied to them;
- `launches`: which paths launch a kernel, what entry returns, and shape-guarded fallbacks;
- `checker`: `check_source`, which parses the file and runs the rule steps in order.
"""

from gpuyantra.verifier.static.checker import check_source
from gpuyantra.verifier.static.report import EntryInfo, StaticReport

__all__ = ["EntryInfo", "StaticReport", "check_source"]
