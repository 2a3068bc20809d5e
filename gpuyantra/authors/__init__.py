"""Authors write candidate kernel files. The offline template author is the default.

`base` holds the interface (`WriteRequest` in, `WrittenCandidate` out); `select.get_author` picks the
configured author; `template`, `llm` and `open_author` are the authors.
"""

from gpuyantra.authors.base import Attempt, Author, WriteRequest, WrittenCandidate
from gpuyantra.authors.select import get_author

__all__ = ["Attempt", "Author", "WriteRequest", "WrittenCandidate", "get_author"]
