"""The skill library: verified kernels in Qdrant, indexed by bottleneck fingerprint.

Storage: a local Qdrant folder by default (`qdrant-client` local mode, `config.qdrant_path()`),
a Qdrant server when `GPUYANTRA_QDRANT_URL` is set (or `url=` is given). One collection,
`gpuyantra_skills`, with a named cosine vector `fingerprint` (see `fingerprint.py`) and, when an
`embedder` is configured, a second named vector `llm` (an LLM embedding of the skill's summary).

Locking (local mode): Qdrant's local mode locks its folder to one client at a time, across
processes and within one. A `SkillStore` therefore holds no client between calls: every method
opens the folder, acts and closes it, unless the store is used as a context manager, which keeps
one client for the whole `with` block. Opening retries while another process (the CPU worker, a
CLI command) holds the folder, up to `lock_timeout` seconds, so two processes take turns instead
of deadlocking; keep `with` blocks short. Within one process, stores on the same folder take
turns on a lock; opening a second store on a folder this thread already holds raises at once.

Skill ids are deterministic: uuid5 of (op, hardware, source digest), so re-upserting the same
kernel updates its record (keeping its bandit statistics and creation time) instead of adding one.
"""

from __future__ import annotations

import builtins
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import gpuyantra.skills.schema as schema
from gpuyantra.hardware import hardware_kind
from gpuyantra.skills.bandit import mean_reward
from gpuyantra.skills.fingerprint import FINGERPRINT_DIM, Fingerprint

COLLECTION = "gpuyantra_skills"
VECTOR = "fingerprint"
LLM_VECTOR = "llm"
SKILL_NAMESPACE = uuid.UUID("6b1f3f5e-4c1a-5d7e-9a2b-67707579616e")  # fixed forever: ids depend on it
_TRANSIENT = ("score", "match")  # Skill fields that describe one retrieval, never stored


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def source_digest(source: str) -> str:
    from gpuyantra.candidate import source_digest as digest

    return digest(source)


def skill_id(op: str, hardware: str, source: str) -> str:
    """The deterministic id of a kernel: same op, hardware and source text -> same id."""
    return str(uuid.uuid5(SKILL_NAMESPACE, f"{op}\n{hardware}\n{source_digest(source)}"))


def current_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("gpuyantra", "torch", "triton", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


@dataclass
class Skill:
    """One verified kernel and what is known about it."""

    id: str = ""
    op: str = ""
    hardware: str = ""
    source: str = ""
    adapter: list[dict[str, str]] = field(default_factory=list)
    strategy: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)  # campaign, iteration, author
    versions: dict[str, str] = field(default_factory=dict)
    pulls: int = 0
    total_reward: float = 0.0
    created_at: str = ""
    # Extensions (optional).
    module_class: str = ""
    source_digest: str = ""
    updated_at: str = ""
    last_reward: float | None = None
    notes: str = ""
    # Served-speed rollbacks of this kernel: {model, campaign, reason, batches, at}, oldest first. A
    # campaign does not deploy it again on a model listed here (unless told to).
    served_rollbacks: list[dict[str, Any]] = field(default_factory=list)
    # The hardware kind the kernel was timed on (gpuyantra/hardware.py:hardware_kind of `hardware`):
    # retrieval keeps to it, since a verdict on one kind says nothing about another.
    hardware_kind: str = ""
    # Set by `retrieve` only: cosine similarity to the query and "exact" (op + hardware) or "transfer".
    score: float | None = None
    match: str | None = None

    def __post_init__(self) -> None:
        if self.source and not self.source_digest:
            self.source_digest = source_digest(self.source)
        if not self.id and self.op and self.source:
            self.id = skill_id(self.op, self.hardware, self.source)
        if self.hardware and not self.hardware_kind:  # records kept before kinds: derived on reading
            self.hardware_kind = hardware_kind(self.hardware)

    @property
    def mean_reward(self) -> float | None:
        return mean_reward(self)

    def fingerprint_obj(self) -> Fingerprint:
        if self.fingerprint:
            return Fingerprint.from_payload(self.fingerprint)
        dtype = self.dtypes[0] if self.dtypes else None
        return Fingerprint.from_target({"op": self.op, "shapes": self.shapes, "dtype": dtype}, self.hardware)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in _TRANSIENT:
            out.pop(key, None)
        return _jsonable(out)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Skill:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# One lock per folder per process: local Qdrant allows one client per folder at a time.
_FOLDER_LOCKS: dict[str, threading.Lock] = {}
_FOLDER_OWNERS: dict[str, int] = {}
_LOCKS_GUARD = threading.Lock()


class SkillStore:
    """Skills in Qdrant: `upsert`, `retrieve`, `record_outcome`, `get`, `list`, `export_jsonl`,
    `import_jsonl`, `close`; also a context manager holding one client for the block."""

    def __init__(
        self,
        path: str | Path | None = None,
        url: str | None = None,
        *,
        collection: str = COLLECTION,
        api_key: str | None = None,
        embedder: Callable[[str], Sequence[float]] | None = None,
        embedder_dim: int | None = None,
        lock_timeout: float = 120.0,
    ) -> None:
        from gpuyantra import config

        if path is None and url is None:
            url = config.qdrant_url()
            if url is None:
                path = config.qdrant_path()
        self.url = url
        self.path = Path(path).resolve() if (path is not None and url is None) else None
        self.collection = collection
        self.api_key = api_key
        self.embedder = embedder
        self.embedder_dim = embedder_dim
        self.lock_timeout = lock_timeout
        self._client = None
        self._held_lock: threading.Lock | None = None
        self._depth = 0
        self._has_llm_vector = False

    # ---------------------------------------------------------------- connection handling

    def __enter__(self) -> SkillStore:
        if self._client is None:
            self._client = self._open()
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0:
            self.close()

    def close(self) -> None:
        client, self._client = self._client, None
        self._depth = 0
        try:
            if client is not None:
                client.close()
        finally:
            self._release()

    def __repr__(self) -> str:
        where = self.url or str(self.path)
        return f"SkillStore({where!r}, collection={self.collection!r})"

    def _lock_for_folder(self) -> threading.Lock | None:
        if self.path is None:
            return None
        key = str(self.path)
        with _LOCKS_GUARD:
            if _FOLDER_OWNERS.get(key) == threading.get_ident():
                raise RuntimeError(
                    f"the skill store folder {key} is already open in this thread; reuse that SkillStore "
                    "instead of opening a second one"
                )
            return _FOLDER_LOCKS.setdefault(key, threading.Lock())

    def _release(self) -> None:
        lock, self._held_lock = self._held_lock, None
        if lock is not None:
            with _LOCKS_GUARD:
                _FOLDER_OWNERS.pop(str(self.path), None)
            lock.release()

    def _open(self):
        from qdrant_client import QdrantClient

        if self.url is not None:
            client = QdrantClient(url=self.url, api_key=self.api_key, timeout=int(self.lock_timeout))
            self._ensure_collection(client)
            return client
        lock = self._lock_for_folder()
        deadline = time.monotonic() + self.lock_timeout
        if not lock.acquire(timeout=self.lock_timeout):
            raise TimeoutError(f"skill store {self.path} stayed busy in this process for {self.lock_timeout:.0f} s")
        self._held_lock = lock
        with _LOCKS_GUARD:
            _FOLDER_OWNERS[str(self.path)] = threading.get_ident()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            delay = 0.02
            while True:
                try:
                    client = QdrantClient(path=str(self.path))
                    break
                except RuntimeError as exc:  # folder held by another process: take turns
                    if "already accessed" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5)
            try:
                self._ensure_collection(client)
            except BaseException:
                client.close()
                raise
            return client
        except BaseException:
            self._release()
            raise

    def _ensure_collection(self, client) -> None:
        from qdrant_client import models

        if client.collection_exists(self.collection):
            info = client.get_collection(self.collection)
            vectors = info.config.params.vectors
            names = set(vectors) if isinstance(vectors, dict) else set()
            if VECTOR not in names:
                raise RuntimeError(f"collection {self.collection!r} has no {VECTOR!r} vector: not a skill library")
            size = vectors[VECTOR].size
            if size != FINGERPRINT_DIM:
                raise RuntimeError(
                    f"collection {self.collection!r} holds {size}-d fingerprints, this version "
                    f"makes {FINGERPRINT_DIM}-d ones: export with the old version, import here"
                )
            self._has_llm_vector = LLM_VECTOR in names
            return
        vectors = {VECTOR: models.VectorParams(size=FINGERPRINT_DIM, distance=models.Distance.COSINE)}
        if self.embedder is not None and self.embedder_dim:
            vectors[LLM_VECTOR] = models.VectorParams(size=int(self.embedder_dim), distance=models.Distance.COSINE)
        client.create_collection(self.collection, vectors_config=vectors)
        self._has_llm_vector = LLM_VECTOR in vectors
        if self.url is not None:  # payload indexes only matter on a server
            for key in ("op", "hardware", "hardware_kind"):
                client.create_payload_index(self.collection, key, field_schema=models.PayloadSchemaType.KEYWORD)

    @contextmanager
    def _session(self) -> Iterator[Any]:
        if self._client is not None:
            yield self._client
            return
        client = self._open()
        try:
            yield client
        finally:
            try:
                client.close()
            finally:
                self._release()

    # ---------------------------------------------------------------- skills

    def _prepare(self, skill: Skill) -> Skill:
        data = skill.to_dict()
        skill = Skill.from_dict(data)  # a copy, transient fields dropped
        if not skill.op or not skill.source:
            raise ValueError("a skill needs at least op and source")
        skill.source_digest = source_digest(skill.source)
        if not skill.id:
            skill.id = skill_id(skill.op, skill.hardware, skill.source)
        if not skill.fingerprint:
            skill.fingerprint = skill.fingerprint_obj().to_payload()
        if not skill.versions:
            skill.versions = current_versions()
        now = _now()
        skill.created_at = skill.created_at or now
        skill.updated_at = now
        return skill

    def _point(self, skill: Skill):
        from qdrant_client import models

        vectors: dict[str, Any] = {VECTOR: Fingerprint.from_payload(skill.fingerprint).vector}
        if self._has_llm_vector and self.embedder is not None:
            vectors[LLM_VECTOR] = [float(x) for x in self.embedder(_summary(skill))]
        return models.PointStruct(id=skill.id, vector=vectors, payload=skill.to_dict())

    def _write(self, client, incoming: Skill, merge_stats: str) -> str:
        existing = client.retrieve(self.collection, [incoming.id], with_payload=True)
        if existing:
            old = Skill.from_dict(existing[0].payload or {})
            incoming.created_at = old.created_at or incoming.created_at
            # Bandit statistics survive re-upserts; on import the record with more pulls wins.
            if merge_stats == "keep" or old.pulls > incoming.pulls:
                incoming.pulls, incoming.total_reward = old.pulls, old.total_reward
                incoming.last_reward = old.last_reward
            # What serving learned of this kernel survives its being learned again.
            incoming.served_rollbacks = old.served_rollbacks + [
                r for r in incoming.served_rollbacks if r not in old.served_rollbacks
            ]
        client.upsert(self.collection, points=[self._point(incoming)], wait=True)
        return incoming.id

    def upsert(self, skill: Skill) -> str:
        """Insert or update a skill (same op, hardware and source -> same id). Returns its id."""
        prepared = self._prepare(skill)
        with self._session() as client:
            return self._write(client, prepared, merge_stats="keep")

    def retrieve(
        self, fingerprint: Fingerprint | Mapping[str, Any] | Sequence[float], op: str, hardware: str, limit: int = 8
    ) -> list[Skill]:
        """Skills of `op` on `hardware`'s kind (or filed under that very name before kinds were kept)
        nearest to `fingerprint`; when there are none, the nearest fingerprints of any family on that
        kind, then on any hardware (transfer). Each has `score` and `match` set."""
        from qdrant_client import models

        vector = _query_vector(fingerprint)
        same_kind = models.Filter(
            should=[
                models.FieldCondition(key="hardware_kind", match=models.MatchValue(value=hardware_kind(hardware))),
                models.FieldCondition(key="hardware", match=models.MatchValue(value=hardware)),
            ]
        )
        of_op = models.FieldCondition(key="op", match=models.MatchValue(value=op))
        with self._session() as client:
            nearest = partial(client.query_points, self.collection, query=vector, using=VECTOR, limit=limit)
            hits = nearest(query_filter=models.Filter(must=[of_op, same_kind]), with_payload=True).points
            match = "exact"
            if not hits:
                hits = nearest(query_filter=models.Filter(must=[same_kind]), with_payload=True).points
                hits = hits or nearest(with_payload=True).points
                match = "transfer"
        out = []
        for hit in hits:
            if not schema.usable(hit.payload, hit.id):
                continue
            skill = Skill.from_dict(hit.payload or {})
            skill.id = str(hit.id)
            skill.score = float(hit.score)
            skill.match = match
            out.append(skill)
        return out

    def search_text(self, text: str, limit: int = 8) -> list[Skill]:
        """Nearest skills by the optional LLM embedding (needs `embedder` and a collection made with it)."""
        if self.embedder is None:
            raise RuntimeError("no embedder configured for this SkillStore")
        with self._session() as client:
            if not self._has_llm_vector:
                raise RuntimeError(f"collection {self.collection!r} was created without the {LLM_VECTOR!r} vector")
            hits = client.query_points(
                self.collection,
                query=[float(x) for x in self.embedder(text)],
                using=LLM_VECTOR,
                limit=limit,
                with_payload=True,
            ).points
        out = []
        for hit in hits:
            if not schema.usable(hit.payload, hit.id):
                continue
            skill = Skill.from_dict(hit.payload or {})
            skill.score, skill.match = float(hit.score), "text"
            out.append(skill)
        return out

    def record_outcome(self, skill_id: str, reward: float) -> Skill:
        """One bandit pull of `skill_id` with this reward, persisted at once. Returns the updated skill."""
        with self._session() as client:
            found = client.retrieve(self.collection, [str(skill_id)], with_payload=True)
            if not found:
                raise KeyError(f"no skill {skill_id!r}")
            skill = Skill.from_dict(found[0].payload or {})
            skill.pulls += 1
            skill.total_reward += float(reward)
            skill.last_reward = float(reward)
            skill.updated_at = _now()
            client.set_payload(
                self.collection,
                payload={
                    "pulls": skill.pulls,
                    "total_reward": skill.total_reward,
                    "last_reward": skill.last_reward,
                    "updated_at": skill.updated_at,
                },
                points=[str(skill_id)],
                wait=True,
            )
        return skill

    def record_served_rollback(self, skill_id: str, entry: Mapping[str, Any]) -> Skill:
        """Remember that the kernel of `skill_id` was rolled back for served speed (`entry`: model,
        campaign, reason, batches); persisted at once. Returns the updated skill."""
        with self._session() as client:
            found = client.retrieve(self.collection, [str(skill_id)], with_payload=True)
            if not found:
                raise KeyError(f"no skill {skill_id!r}")
            skill = Skill.from_dict(found[0].payload or {})
            skill.served_rollbacks = [*skill.served_rollbacks, {**_jsonable(dict(entry)), "at": _now()}]
            skill.updated_at = _now()
            client.set_payload(
                self.collection,
                payload={"served_rollbacks": skill.served_rollbacks, "updated_at": skill.updated_at},
                points=[str(skill_id)],
                wait=True,
            )
        return skill

    def served_rollbacks(self, skill_id: str, model: str) -> builtins.list[dict[str, Any]]:
        """The served-speed rollbacks of `skill_id`'s kernel on `model`, oldest first ([] for an
        unknown skill)."""
        skill = self.get(skill_id)
        return [r for r in (skill.served_rollbacks if skill else []) if r.get("model") == model]

    def get(self, id: str) -> Skill | None:
        """The skill with this id (a unique prefix of an id also works), or None."""
        with self._session() as client:
            try:
                uuid.UUID(str(id))
                found = client.retrieve(self.collection, [str(id)], with_payload=True)
                usable = found and schema.usable(found[0].payload, id)
                return Skill.from_dict(found[0].payload or {}) if usable else None
            except ValueError:
                matches = [s for s in self._scroll(client) if s.id.startswith(str(id))]
                return matches[0] if len(matches) == 1 else None

    def list(self, op: str | None = None, hardware: str | None = None) -> list[Skill]:
        """Every stored skill (optionally of one op / hardware), best reward first within each op."""
        with self._session() as client:
            skills = self._scroll(client, op=op, hardware=hardware)
        return sorted(skills, key=lambda s: (s.op, s.hardware, -float(s.reward or 0), s.id))

    def count(self) -> int:
        with self._session() as client:
            return client.count(self.collection, exact=True).count

    # builtins.list: `list` is the method above in this class's scope.
    def _scroll(self, client, op: str | None = None, hardware: str | None = None) -> builtins.list[Skill]:
        from qdrant_client import models

        must: builtins.list[models.Condition] = []
        if op is not None:
            must.append(models.FieldCondition(key="op", match=models.MatchValue(value=op)))
        if hardware is not None:
            must.append(models.FieldCondition(key="hardware", match=models.MatchValue(value=hardware)))
        flt = models.Filter(must=must) if must else None
        out, offset = [], None
        while True:
            points, offset = client.scroll(
                self.collection, scroll_filter=flt, limit=256, offset=offset, with_payload=True, with_vectors=False
            )
            for point in points:
                if not schema.usable(point.payload, point.id):
                    continue  # one bad record (written before imports were checked) never breaks the library
                skill = Skill.from_dict(point.payload or {})
                skill.id = str(point.id)
                out.append(skill)
            if offset is None:
                return out

    def export_jsonl(self, path: str | Path, op: str | None = None) -> int:
        """Write every skill (with its bandit statistics) as one JSON object a line. Returns the count."""
        skills = self.list(op=op)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w") as fh:
            for skill in skills:
                fh.write(json.dumps(skill.to_dict(), sort_keys=True) + "\n")
        tmp.replace(path)
        return len(skills)

    def import_jsonl(self, path: str | Path) -> int:
        """Upsert every skill of a JSONL export (vectors are recomputed from the fingerprint fields;
        where the id exists already, the record with more bandit pulls keeps its statistics). A line
        that is not a skill of the store's shape (`gpuyantra/skills/schema.py`) is an
        InvalidSkillRecord naming it, and nothing is imported."""
        skills = []
        with Path(path).open() as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise schema.InvalidSkillRecord(f"{path}:{number}: not JSON: {exc}") from None
                schema.check(data, f"{path}:{number}")  # every line before anything is written
                skill = Skill.from_dict(data)
                created, updated = skill.created_at, skill.updated_at
                skill = self._prepare(skill)
                skill.created_at, skill.updated_at = created or skill.created_at, updated or skill.updated_at
                skills.append(skill)
        with self._session() as client:
            for skill in skills:
                self._write(client, skill, merge_stats="more_pulls")
        return len(skills)


def _query_vector(fingerprint: Any) -> list[float]:
    if isinstance(fingerprint, Fingerprint):
        return fingerprint.vector
    if isinstance(fingerprint, Mapping):
        return Fingerprint.from_payload(fingerprint).vector
    vector = [float(x) for x in fingerprint]
    if len(vector) != FINGERPRINT_DIM:
        raise ValueError(f"a fingerprint vector has {FINGERPRINT_DIM} numbers, got {len(vector)}")
    return vector


def _summary(skill: Skill) -> str:
    fp = skill.fingerprint_obj()
    return (
        f"{skill.op} kernel for {skill.module_class or 'any module'} on {skill.hardware}: {fp.describe()}; "
        f"strategy {json.dumps(skill.strategy, sort_keys=True, default=str)}; reward {skill.reward}"
    )
