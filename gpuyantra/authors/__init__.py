"""Authors write candidate kernel files. The offline template author is the default."""

from gpuyantra.authors.base import Attempt, Author, WriteRequest, WrittenCandidate, get_author

__all__ = ["Attempt", "Author", "WriteRequest", "WrittenCandidate", "get_author"]
