"""The project folder: keepstep.toml, contract.md, sources.toml + sources/, plan.toml.

Reading is strict and every problem says which file and what to do. Nothing here
touches the database; see ``engine.project`` for the run-facing API.
"""

from __future__ import annotations

import threading
import tomllib
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from keepstep.engine.core.inputs import Contract, InputSnapshot, SourceEntry, source_hashes
from keepstep.engine.core.plan import Plan, PlanProblem, locate_lines
from keepstep.engine.errors import (
    ConfigError,
    KeepstepError,
    PlanValidationError,
    ProjectError,
    SourceError,
)
from keepstep.engine.files.confine import project_file, unsafe_file
from keepstep.engine.files.convert import (
    DEFAULT_MAX_SOURCE_MB,
    ConversionCache,
    ConvertedSource,
    detect_format,
)
from keepstep.engine.files.plan_file import PlanCache
from keepstep.storage.hashing import file_sha256

CONFIG_FILE = "keepstep.toml"
CONTRACT_FILE = "contract.md"
SOURCES_FILE = "sources.toml"
PLAN_FILE = "plan.toml"
STATE_DIR = ".keepstep"
CONVERTED_DIR = "converted"  # under STATE_DIR: the conversion cache (derived, never copied)
FRONT_MATTER = "+++"  # TOML front matter (what keepstep writes)
YAML_FRONT_MATTER = "---"  # YAML front matter (most Markdown tools' convention), also read


class ModelSettings(BaseModel):
    """What keepstep.toml says of one model (``[model_settings."provider/model"]``), for what
    litellm's model information does not know or knows wrong (docs/config.md)."""

    model_config = ConfigDict(extra="forbid")
    # The price in the currency of [budget] cost per million tokens, in and out: with it, an
    # unpriced model's calls count against a cost budget instead of being refused.
    input_per_mtok: float | None = Field(default=None, ge=0)
    output_per_mtok: float | None = Field(default=None, ge=0)
    # The model's own cap on one answer (litellm's, when it knows one, otherwise none).
    max_output_tokens: int | None = Field(default=None, gt=0)
    # The model's window; wins over the project-wide context_tokens.
    context_tokens: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _price_is_a_pair(self) -> ModelSettings:
        given = (self.input_per_mtok, self.output_per_mtok)
        if (given[0] is None) != (given[1] is None):
            raise ValueError("give both input_per_mtok and output_per_mtok (the price per "
                             "million input and output tokens)")
        if given[0] is not None and given[1] is not None and given[0] + given[1] <= 0:
            raise ValueError("a price of 0 keeps no cost budget: give the model's real price, "
                             "call a free local model through api_base, or remove [budget] cost")
        return self

    def price_per_token(self) -> tuple[float, float] | None:
        """(input, output) price per token, or None when keepstep.toml gives none."""
        if self.input_per_mtok is None or self.output_per_mtok is None:
            return None
        return self.input_per_mtok / 1e6, self.output_per_mtok / 1e6


class BudgetLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    calls: float | None = None
    tool_calls: float | None = None
    tokens: float | None = None
    cost: float | None = None
    wall_time_s: float | None = None
    retries: float | None = None
    recoveries: float | None = None
    storage_bytes: float | None = None

    def as_limits(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.model_dump().items() if v is not None}


class RunPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    max_unit_retries: int = 2
    max_recoveries: int = 5
    recovery_cooldown_s: float = 5.0
    stall_no_commit_s: float = 1800.0
    stall_repeated_errors: int = 3


class ProviderLimits(BaseModel):
    """``[providers.NAME]``: limits shared by every unit calling that provider (the name is
    litellm's provider: ``openai``, ``anthropic``, ``ollama``, ``local``…). Unset = no limit."""

    model_config = ConfigDict(extra="forbid")
    max_concurrent: int | None = Field(default=None, ge=1)
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)


class FileDropConfig(BaseModel):
    """``[adapters.NAME] type = "file_drop"``: delivered files are copied into ``target_dir``.

    A relative ``target_dir`` resolves against the project root; it must lie outside the
    project (checked by ``load_config``).
    """

    model_config = ConfigDict(extra="forbid")
    type: Literal["file_drop"]
    target_dir: str

    def target(self, root: Path) -> Path:
        return (Path(root) / Path(self.target_dir).expanduser()).resolve()


class WebhookConfig(BaseModel):
    """``[adapters.NAME] type = "webhook"``: a JSON POST with an ``Idempotency-Key`` header.

    No credentials: adapters never get secrets (not from the DB, not from here); the
    request body is kept in the side-effect ledger and must hold none either.
    """

    model_config = ConfigDict(extra="forbid")
    type: Literal["webhook"]
    url: str
    timeout_s: float = Field(default=10.0, gt=0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{value!r} is not an http(s) URL")
        if parts.username is not None or parts.password is not None:
            # Never echo the URL back: it holds the secret.
            raise ValueError(
                f"the URL carries a user or password ({parts.scheme}://…@{parts.hostname}/…); "
                "keepstep.toml must hold no credentials — remove them from the URL "
                "(credentials come from the keyring or the environment)")
        return value


class FolderConfig(BaseModel):
    """``[adapters.NAME] type = "folder"``: a synced client folder. Each delivered file
    appears atomically under a content-hash name (``memo-1a2b3c4d5e6f.md``), so delivering
    the same bytes again changes nothing: idempotent by construction. ``target_dir`` must lie
    outside the project (a relative one resolves against the project root)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["folder"]
    target_dir: str

    def target(self, root: Path) -> Path:
        return (Path(root) / Path(self.target_dir).expanduser()).resolve()


class EmailConfig(BaseModel):
    """``[adapters.NAME] type = "email"``: each delivered file is mailed as an attachment over
    SMTP with STARTTLS (required unless ``host`` is this machine and ``starttls = false``);
    its Message-ID is the idempotency key. The password is never here: store it with
    ``keepstep keys set smtp-NAME`` (or the environment variable ``SMTP_NAME_API_KEY``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["email"]
    host: str = Field(description="the SMTP server's name or address")
    port: int = Field(default=587, ge=1, le=65535, description="submission port (STARTTLS)")
    sender: str = Field(alias="from", description="the From address")
    to: list[str] = Field(min_length=1, description="the recipients")
    subject: str = Field(default="Delivery: {name}", description="the subject; {name} is the "
                         "file's name")
    username: str | None = Field(default=None, description="the SMTP login (password from "
                                 "`keepstep keys set smtp-NAME`)")
    starttls: bool = Field(default=True, description="upgrade with STARTTLS before sending "
                           "anything; only a server on this machine may turn it off")
    ca_file: str | None = Field(default=None, description="a CA bundle to trust for this "
                                "server (e.g. a company's own CA), relative to the project")
    timeout_s: float = Field(default=30.0, gt=0)

    @field_validator("starttls")
    @classmethod
    def _tls_off_only_here(cls, value: bool, info: Any) -> bool:
        host = str(info.data.get("host", ""))
        if not value and host not in ("localhost", "127.0.0.1", "::1"):
            raise ValueError(f"starttls = false is refused for {host!r}: a password and the "
                             "documents would cross the network unencrypted")
        return value


class StoreConfig(BaseModel):
    """``[store]``: where the run state lives (docs/team.md). No url: the embedded SQLite
    file; ``url = "postgresql://user@host:5432/db"``: a team's PostgreSQL server (the
    password never here: PGPASSWORD, ~/.pgpass or ``keepstep keys set postgres``).
    KEEPSTEP_STORE_URL wins over it."""

    model_config = ConfigDict(extra="forbid")
    url: str | None = None

    @field_validator("url")
    @classmethod
    def _no_password(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from keepstep.storage.selection import check_url

        try:
            return check_url(value, allow_password=False)
        except KeepstepError as exc:
            raise ValueError(exc.message + f" ({exc.hint})") from None


AdapterConfig = Annotated[FileDropConfig | WebhookConfig | FolderConfig | EmailConfig,
                          Field(discriminator="type")]
ADAPTER_TYPES = ("file_drop", "webhook", "folder", "email")


class ProjectConfig(BaseModel):
    """keepstep.toml. The model settings are documented in docs/config.md."""

    model_config = ConfigDict(extra="forbid")
    name: str
    # The run a command shows when --run is not given (`keepstep init` and the sample pack
    # write it); without it, the newest run.
    default_run: str | None = None
    # -- models: which model a unit calls, where, and how (docs/config.md) --
    default_model: str = "local/keepstep-offline"
    models: dict[str, str] = Field(default_factory=dict)  # per unit kind, optional
    unit_models: dict[str, str] = Field(default_factory=dict)  # per unit id, wins over kind
    api_base: str | None = None  # every provider's address, unless api_bases names it
    api_bases: dict[str, str] = Field(default_factory=dict)  # per provider, e.g. ollama_chat
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(default=4096, gt=0)  # an answer's cap, reserved before each call
    context_tokens: int | None = Field(default=None, gt=0)  # window when litellm does not know
    # Per model name: its price, output cap and window where litellm does not know them.
    model_settings: dict[str, ModelSettings] = Field(default_factory=dict)
    revise_rounds: int = Field(default=2, ge=0, le=5)  # re-asks with feedback per model step
    request_timeout_s: float = Field(default=120.0, gt=0)
    budget: BudgetLimits = Field(default_factory=BudgetLimits)
    policy: RunPolicy = Field(default_factory=RunPolicy)
    high_risk_rules: list[dict[str, Any]] = Field(default_factory=list)
    versions: dict[str, str] = Field(default_factory=dict)  # prompt/tool/policy version pins
    # External systems a `deliver` unit may act on, by name (see engine.effects).
    adapters: dict[str, AdapterConfig] = Field(default_factory=dict)
    # Units in flight at once in one executor (``--jobs`` overrides; 1 = one at a time).
    max_parallel: int = Field(default=4, ge=1, le=64)
    store: StoreConfig = Field(default_factory=StoreConfig)
    providers: dict[str, ProviderLimits] = Field(default_factory=dict)
    # Largest source file accepted (add, validate, run start); also caps what a DOCX or PPTX
    # may expand to when unpacked.
    max_source_mb: float = Field(default=DEFAULT_MAX_SOURCE_MB, gt=0)
    # How long a provider may keep failing with transient errors (429, 5xx, timeouts, dropped
    # connections) before the units waiting for it are blocked; until then they wait and no
    # attempt is used up (engine.gateway.outage).
    provider_outage_minutes: float = Field(default=10.0, gt=0)

    @property
    def max_source_bytes(self) -> int:
        """``max_source_mb`` in bytes."""
        return int(self.max_source_mb * 1024 * 1024)

    def model_for(self, unit_id: str, kind: str) -> str:
        """The model a unit calls: ``unit_models[unit]``, else ``models[kind]``, else
        ``default_model``."""
        return self.unit_models.get(unit_id) or self.models.get(kind) or self.default_model

    def settings_for(self, model: str) -> ModelSettings:
        """``model_settings[model]``, or empty settings."""
        return self.model_settings.get(model) or ModelSettings()

    def api_base_for(self, model: str) -> str | None:
        """Where ``model`` is called: ``api_bases[<provider prefix>]``, else ``api_base``,
        else None (litellm's default, or its ``<PROVIDER>_API_BASE`` environment variable)."""
        provider = model.split("/", 1)[0] if "/" in model else ""
        return self.api_bases.get(provider) or self.api_base

    def models_in_use(self, units: list[tuple[str, str]]) -> dict[str, list[str]]:
        """model -> the units (``(id, kind)`` pairs given) that call it, in the given order."""
        out: dict[str, list[str]] = {}
        for unit_id, kind in units:
            out.setdefault(self.model_for(unit_id, kind), []).append(unit_id)
        return out


class SourcesFile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    sources: list[SourceEntry] = Field(default_factory=list, alias="source")


def _read_toml(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ProjectError(f"{path} is missing", hint=f"every project needs {what}; "
                           "`keepstep init DIR` creates a working example")
    try:
        return tomllib.loads(read_project_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise ProjectError(f"{path} is not valid TOML: {exc}",
                           hint="fix the line it names") from exc


MAX_PROJECT_FILE_BYTES = 16 * 1024 * 1024  # keepstep.toml, contract.md, sources.toml, plan.toml


def read_project_text(path: Path) -> str:
    """A project file's text; ProjectError naming it when it is not UTF-8, too large or
    unreadable (never a raw UnicodeDecodeError or OSError)."""
    try:
        size = path.stat().st_size
        if size > MAX_PROJECT_FILE_BYTES:
            raise ProjectError(f"{path} is {size} bytes, over the "
                               f"{MAX_PROJECT_FILE_BYTES // (1024 * 1024)} MB limit for a "
                               "project file", hint="a project file is hand-written text; "
                               "check that this is the right file")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProjectError(f"{path} is not valid UTF-8 text (byte {exc.start})",
                           hint="save it as UTF-8 (in most editors: Save as → Encoding → "
                           "UTF-8)") from None
    except OSError as exc:
        raise ProjectError(f"{path} cannot be read: {exc.strerror or exc}",
                           hint="check the file's permissions") from None


def _shape_errors(path: Path, exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())


def load_config(root: Path) -> ProjectConfig:
    path = root / CONFIG_FILE
    raw = _read_toml(path, "a keepstep.toml (name, default model, budget limits)")
    _check_adapter_types(path, raw.get("adapters"))
    try:
        config = ProjectConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_shape_errors(path, exc)}",
                          hint="see README.md for the keys keepstep.toml accepts") from exc
    project = Path(root).resolve()
    for name, adapter in config.adapters.items():
        if isinstance(adapter, FileDropConfig | FolderConfig):
            target = adapter.target(project)
            if target == project or project in target.parents:
                raise ConfigError(
                    f"{path}: adapter {name!r}: target_dir {adapter.target_dir!r} is inside the "
                    "project", hint="a file drop delivers outside the project: point target_dir "
                    "at a folder beside it (e.g. \"../client-share\")")
    return config


def _check_adapter_types(path: Path, adapters: Any) -> None:
    # Checked before pydantic so the message names the adapter and the allowed types
    # plainly instead of a discriminated-union error.
    if not isinstance(adapters, dict):
        return
    for name, table in adapters.items():
        kind = table.get("type") if isinstance(table, dict) else None
        if kind not in ADAPTER_TYPES:
            raise ConfigError(
                f"{path}: adapter {name!r} has type {kind!r}; allowed types: "
                f"{', '.join(ADAPTER_TYPES)}",
                hint=f'set type = "webhook" (with url), "folder" (with target_dir), "email" '
                f'(with host, from, to) or "file_drop" (with target_dir) under '
                f"[adapters.{name}]; see docs/delivery.md")


def _yaml_fields(text: str, origin: str) -> dict[str, Any]:
    """YAML front matter as plain values (safe loader; dates as ISO text, like TOML's)."""
    import datetime as _dt

    import yaml  # PyYAML: only a YAML contract needs it

    try:
        loaded = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise ProjectError(f"{origin}: front matter is not valid YAML: "
                           f"{str(exc).splitlines()[0]}",
                           hint="write one 'name: value' per line between the '---' lines"
                           ) from exc
    if not isinstance(loaded, dict):
        raise ProjectError(f"{origin}: YAML front matter is not a set of 'name: value' fields",
                           hint="write one 'name: value' per line between the '---' lines")

    def plain(value: Any) -> Any:
        if isinstance(value, _dt.date):
            return value.isoformat()
        if isinstance(value, list):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        return value

    return {str(k): plain(v) for k, v in loaded.items() if v is not None}


# keepstep's own templates for the standard documents; a project's templates/<name>.md wins.
DEFAULT_TEMPLATES_DIR = Path(__file__).resolve().parent / "default_templates"
DEFAULT_TEMPLATES = ("appendix", "change-notes", "evidence-table", "risk-register")


def template_file(root: Path, name: str) -> Path | None:
    """The file of template ``name``: the project's ``templates/<name>.md`` when it exists,
    else keepstep's built-in one for a standard document (``DEFAULT_TEMPLATES``), else None.
    The project's own file is confined to the project: UnsafePathError when it leads outside."""
    own = project_file(root, "templates", f"{name}.md", what="template")
    if own.is_file():
        return own
    if name in DEFAULT_TEMPLATES:
        return DEFAULT_TEMPLATES_DIR / f"{name}.md"
    return None


def parse_contract(text: str, *, origin: str = CONTRACT_FILE) -> Contract:
    """contract.md: TOML (``+++``) or YAML (``---``) front matter, then the body."""
    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    fence = lines[0].strip() if lines else ""
    if fence not in (FRONT_MATTER, YAML_FRONT_MATTER):
        raise ProjectError(
            f"{origin} has no front matter",
            hint=f"start it with a '{FRONT_MATTER}' line, TOML fields such as audience = \"...\" "
            f"and goal = \"...\", then a closing '{FRONT_MATTER}' line (or the same fields as "
            f"YAML between two '{YAML_FRONT_MATTER}' lines)",
        )
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == fence)
    except StopIteration:
        raise ProjectError(f"{origin}: front matter is not closed",
                           hint=f"add a '{fence}' line after the fields") from None
    if fence == YAML_FRONT_MATTER:
        fields = _yaml_fields("".join(lines[1:end]), origin)
    else:
        try:
            fields = tomllib.loads("".join(lines[1:end]))
        except tomllib.TOMLDecodeError as exc:
            raise ProjectError(f"{origin}: front matter is not valid TOML: {exc}") from exc
    for required in ("audience", "goal"):
        if not str(fields.get(required, "")).strip():
            raise ProjectError(f"{origin}: front matter needs a non-empty {required!r}",
                               hint=f'add a line such as {required} = "..."')
    return Contract(fields=fields, body="".join(lines[end + 1:]).strip() + "\n")


def load_contract(root: Path) -> Contract:
    path = root / CONTRACT_FILE
    if not path.is_file():
        raise ProjectError(f"{path} is missing",
                           hint="write the task contract (audience, goal) in contract.md")
    return parse_contract(read_project_text(path), origin=str(path))


def write_contract(root: Path, contract: Contract) -> None:
    text = f"{FRONT_MATTER}\n{tomli_w.dumps(contract.fields)}{FRONT_MATTER}\n\n{contract.body}"
    (root / CONTRACT_FILE).write_text(text, encoding="utf-8")


def load_sources(root: Path) -> SourcesFile:
    path = root / SOURCES_FILE
    raw = _read_toml(path, "a sources.toml listing the approved sources")
    try:
        sf = SourcesFile.model_validate(raw)
    except ValidationError as exc:
        raise SourceError(f"{path}: {_shape_errors(path, exc)}") from exc
    seen: set[str] = set()
    for s in sf.sources:
        if s.id in seen:
            raise SourceError(f"{path}: source id {s.id!r} appears twice",
                              hint="give each source its own id")
        seen.add(s.id)
    return sf


def save_sources(root: Path, sf: SourcesFile) -> None:
    data = sf.model_dump(mode="json", by_alias=True)
    tmp = root / (SOURCES_FILE + ".tmp")
    tmp.write_bytes(tomli_w.dumps(data).encode("utf-8"))
    tmp.replace(root / SOURCES_FILE)


def snapshot_sources(root: Path, sf: SourcesFile) -> InputSnapshot:
    """Hash every approved source (whole file, header lines, body); a missing file is an
    error naming it."""
    hashes, groups, headers, bodies = {}, {}, {}, {}
    for s in sf.sources:
        if not s.approved:
            continue
        p = (root / s.path).resolve()
        if not p.is_relative_to(root.resolve()):
            raise SourceError(f"source {s.id}: path {s.path!r} leaves the project folder",
                              hint="keep sources inside the project (sources/...)")
        if not p.is_file():
            raise SourceError(
                f"source {s.id}: file {s.path} is missing",
                hint="restore the file, or revoke the source with "
                f"`keepstep sources revoke {s.id}` (units that used it will be invalidated)",
            )
        hashes[s.id] = file_sha256(str(p))
        groups[s.id] = s.group
        headers[s.id], bodies[s.id] = source_hashes(s, p.read_bytes())
    return InputSnapshot(sources=hashes, groups=groups, headers=headers, bodies=bodies)


def conversion_cache(root: Path) -> ConversionCache:
    """The project's conversion cache (``.keepstep/converted/``)."""
    return ConversionCache(Path(root) / STATE_DIR / CONVERTED_DIR)


class ProjectFiles(BaseModel):
    """Everything read from a project folder, validated together.

    Units read a source as its converted text (``converted_source``): Markdown with locators,
    made once per (sha256, converter version) and cached under ``.keepstep/converted/``.
    """

    root: Path
    config: ProjectConfig
    contract: Contract
    sources: SourcesFile
    plan: Plan
    _cache: ConversionCache | None = PrivateAttr(default=None)
    # (the plan object, its fingerprint): seeded from the plan cache at load; recomputed
    # when ``plan`` is replaced by another object.
    _fingerprint: tuple[Plan, str] | None = PrivateAttr(default=None)

    def plan_fingerprint(self) -> str:
        """``self.plan.fingerprint()``, remembered for this plan object (the plan cache
        stores it with the parsed plan, so a fresh process does not hash 10,000 units)."""
        memo = self._fingerprint
        if memo is None or memo[0] is not self.plan:
            memo = self._fingerprint = (self.plan, self.plan.fingerprint())
        return memo[1]

    def approved_sources(self) -> dict[str, SourceEntry]:
        return {s.id: s for s in self.sources.sources if s.approved}

    def source_path(self, source_id: str) -> Path:
        """Where an approved source's file is; SourceError when it is not approved."""
        entry = self.approved_sources().get(source_id)
        if entry is None:
            raise SourceError(f"source {source_id} is not approved")
        why = unsafe_file(self.root, entry.path, what=f"source {source_id}")
        if why:  # validate refuses it too; the folder may have changed since
            raise SourceError(why, hint="keep sources inside the project (sources/...), as "
                              "copies, not links")
        return self.root / entry.path

    def conversion_cache(self) -> ConversionCache:
        if self._cache is None:
            self._cache = conversion_cache(self.root)
        return self._cache

    def converted_source(self, source_id: str, *, sha256: str | None = None,
                         cancel: threading.Event | None = None) -> ConvertedSource:
        """The converted text and locators of an approved source (cached).

        ``sha256`` is the file's when the caller knows it (None hashes the file). Raises a
        ConversionError (a SourceError) naming the file and what to do for a file that
        cannot be read, RunCancelled soon after ``cancel`` is set.
        """
        path = self.source_path(source_id)
        try:
            return self.conversion_cache().get_or_convert(
                path, sha256, max_bytes=self.config.max_source_bytes, cancel=cancel)
        except FileNotFoundError:
            raise SourceError(f"source {source_id}: file {path} is missing",
                              hint="restore the file, or revoke the source") from None

    def source_text(self, source_id: str, *, cancel: threading.Event | None = None) -> str:
        """An approved source's converted text (Markdown; for .md and .txt, the text itself)."""
        return self.converted_source(source_id, cancel=cancel).whole_text()

    def source_formats(self) -> dict[str, str]:
        """Approved source id -> detected format (``pdf``, ``md``…); a file that cannot be
        read is left out (``engine.files.sources.check_sources`` names it)."""
        out: dict[str, str] = {}
        for sid in self.approved_sources():
            try:
                out[sid] = detect_format(self.source_path(sid))
            except (SourceError, OSError):  # ConversionError is a SourceError
                continue
        return out


def load_project_files(root: Path, *, validate: bool = True) -> ProjectFiles:
    root = Path(root)
    if not root.is_dir():
        raise ProjectError(f"{root} is not a folder", hint="pass a project folder, or "
                           "create one with `keepstep init DIR`")
    config = load_config(root)
    contract = load_contract(root)
    sources = load_sources(root)
    cache = PlanCache(root / STATE_DIR)
    plan = cache.load(root / PLAN_FILE)
    files = ProjectFiles(root=root, config=config, contract=contract, sources=sources, plan=plan)
    files._fingerprint = (plan, cache.fingerprint(plan))
    if validate:
        problems = plan_problems(files, cache=cache)
        cache.flush()
        if problems:
            raise PlanValidationError([p.line() for p in problems], problems=problems)
    cache.flush()
    return files


def with_lines(root: Path, problems: list[Any]) -> list[Any]:
    """``problems`` with their line in the project's plan.toml (``core.plan.locate_lines``);
    the file is read only when there are problems."""
    if not problems:
        return problems
    try:
        return locate_lines((Path(root) / PLAN_FILE).read_text(encoding="utf-8"), problems)
    except (OSError, UnicodeDecodeError):
        return problems


def plan_problems(files: ProjectFiles, *, cache: PlanCache | None = None) -> list[Any]:
    """The plan's own problems (``core.plan.find_problems``) against the approved sources and
    the contract's fields. The checks against the rest of the folder (templates, data files,
    adapters, prompts, providers) are ``run.folder_checks.file_problems``: they need the
    gateway, which sits above this package."""
    from keepstep.engine.core.plan_checks import find_problems

    approved = {s.id: s.approved for s in files.sources.sources}
    groups = {s.group for s in files.sources.sources if s.approved and s.group}
    fields = set(files.contract.fields) | {"body"}
    context: dict[str, Any] = {"sources": approved, "groups": groups, "contract_fields": fields}

    def check() -> list[PlanProblem]:
        return with_lines(files.root, find_problems(files.plan, sources=approved, groups=groups,
                                                    contract_fields=fields))

    if cache is None:  # ``cache``: the PlanCache that loaded files.plan (same process)
        return check()
    return cache.problems(context, check)
