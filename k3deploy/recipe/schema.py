"""Typed model of the vLLM recipes schema, and the loader.

A recipe is the YAML file the vLLM recipes site renders its command builder from
(``models/<org>/<name>.yaml`` in vllm-project/recipes). Every field the resolver reads is typed here;
fields it does not read are kept (``extra="allow"``) so that newer recipes still load.

Example::

    >>> from k3deploy import load_recipe
    >>> recipe = load_recipe()              # the vendored Kimi-K3 recipe
    >>> recipe.model.model_id
    'moonshotai/Kimi-K3'
    >>> list(recipe.variants)
    ['default', 'nvfp4', 'ascend_w4a8']
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictStr,
    ValidationError,
    field_validator,
)

from k3deploy.errors import RecipeError
from k3deploy.recipe import yamlfile

#: The vendored recipe (``recipes/kimi-k3.yaml``; see ``recipes/README.md`` for its provenance).
VENDORED_RECIPE = Path(__file__).resolve().parents[1] / "data" / "kimi-k3.yaml"

Args = list[StrictStr]
_T = TypeVar("_T")


def _env_value(value: Any) -> str:
    # YAML scalars in env maps become strings the way the builder's JS would print them.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ValueError(f"env values must be strings, got {type(value).__name__} {value!r}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=False)


def _env_dict(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of NAME: value, got {type(value).__name__}")
    return {str(k): _env_value(v) for k, v in value.items()}


#: An env block: NAME -> value, values coerced to strings.
EnvDict = Annotated[dict[str, str], BeforeValidator(_env_dict)]
OptEnvDict = Annotated[dict[str, str] | None, BeforeValidator(lambda v: None if v is None else _env_dict(v))]


class HardwareBlock(_Model):
    """``hardware_overrides.<key>`` at recipe, variant or strategy level."""

    extra_args: Args = Field(default_factory=list)
    extra_env: EnvDict = Field(default_factory=dict)
    docker_image: str | None = None
    frontend: str | None = None



class FeatureOverride(_Model):
    args: Args | None = None
    env: OptEnvDict = None


class FeatureMode(_Model):
    args: Args | None = None
    env: OptEnvDict = None
    variants: list[str] | None = None
    hardware: dict[str, str] | None = None
    hardware_overrides: dict[str, FeatureOverride | None] | None = None


class Feature(_Model):
    description: str | None = None
    args: Args | None = None
    env: OptEnvDict = None
    strategies: list[str] | None = None
    hardware_overrides: dict[str, FeatureOverride | None] | None = None
    modes: dict[str, FeatureMode] | None = None
    default_mode: str | None = None
    companion: dict[str, Any] | None = None


class Variant(_Model):
    model_id: str | None = None
    precision: str | None = None
    label: str | None = None
    description: str | None = None
    vram_minimum_gb: float | None = None
    supported_hardware: list[str] | None = None
    precision_hardware: Any = None
    extra_args: Args = Field(default_factory=list)
    extra_env: EnvDict = Field(default_factory=dict)
    hardware_overrides: dict[str, HardwareBlock | None] = Field(default_factory=dict)
    docker_image: str | dict[str, Any] | None = None
    tp: int | dict[str, int] | None = None
    default_modes: dict[str, str] | None = None
    nightly_required: bool = False


    @field_validator("hardware_overrides", mode="before")
    @classmethod
    def _ho(cls, v: Any) -> Any:
        return {} if v is None else v


class RoleOverride(_Model):
    """``strategy_overrides.pd_cluster.prefill`` / ``.decode``."""

    parallelism: str | None = None
    parallel_flag: str | None = None
    tp: int | None = None
    nodes: int | dict[str, int] | None = None
    vllm_args: Args = Field(default_factory=list)
    extra_args: Args = Field(default_factory=list)
    env: EnvDict = Field(default_factory=dict)
    hardware_overrides: dict[str, HardwareBlock | None] = Field(default_factory=dict)


    @field_validator("hardware_overrides", mode="before")
    @classmethod
    def _ho(cls, v: Any) -> Any:
        return {} if v is None else v


class RouterOverride(_Model):
    intra_node_data_parallel_size: int | None = None
    policy: str | None = None


class StrategyOverride(_Model):
    extra_args: Args = Field(default_factory=list)
    vllm_args: Args = Field(default_factory=list)
    env: EnvDict = Field(default_factory=dict)
    extra_env: EnvDict = Field(default_factory=dict)
    hardware_overrides: dict[str, HardwareBlock | None] = Field(default_factory=dict)
    tp: int | dict[str, int] | None = None
    pool_modes: list[str] | None = None
    prefill: RoleOverride | None = None
    decode: RoleOverride | None = None
    router: RouterOverride | None = None


    @field_validator("hardware_overrides", mode="before")
    @classmethod
    def _ho(cls, v: Any) -> Any:
        return {} if v is None else v


class Meta(_Model):
    title: str | None = None
    slug: str | None = None
    provider: str | None = None
    description: str | None = None
    default_hardware: str | None = None
    hardware: dict[str, str] = Field(default_factory=dict)

    @field_validator("hardware", mode="before")
    @classmethod
    def _hw(cls, v: Any) -> Any:
        return {} if v is None else v


class ModelInfo(_Model):
    model_id: str
    min_vllm_version: str | None = None
    default_frontend: str | dict[str, str] | None = None
    base_args: Args = Field(default_factory=list)
    base_env: EnvDict = Field(default_factory=dict)
    docker_image: str | dict[str, Any] | None = None
    nightly_required: bool = False
    context_length: int | None = None


    @field_validator("base_args", mode="before")
    @classmethod
    def _args(cls, v: Any) -> Any:
        return [] if v is None else v


class Recipe(_Model):
    """A whole recipe file. ``source`` is the path it was read from (not part of the schema)."""

    meta: Meta = Field(default_factory=Meta)
    model: ModelInfo
    features: dict[str, Feature] = Field(default_factory=dict)
    opt_in_features: list[str] = Field(default_factory=list)
    hardware_opt_in_features: dict[str, list[str]] = Field(default_factory=dict)
    variants: dict[str, Variant]
    compatible_strategies: list[str] = Field(default_factory=list)
    strategy_hardware: dict[str, dict[str, str]] = Field(default_factory=dict)
    strategy_min_gpus: int | dict[str, int | dict[str, int] | None] | None = None
    default_strategy: str | None = None
    hardware_overrides: dict[str, HardwareBlock | None] = Field(default_factory=dict)
    strategy_overrides: dict[str, StrategyOverride | None] = Field(default_factory=dict)
    guide: str | None = None
    source: str | None = None
    #: memoised derived data (offered strategies per hardware, ...): a recipe is not changed once loaded
    _memo: dict[Any, Any] = PrivateAttr(default_factory=dict)

    def memo(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()`` once per key for this recipe object."""
        try:
            return cast(_T, self._memo[key])
        except KeyError:
            value = self._memo[key] = compute()
            return value

    @field_validator(
        "features", "hardware_opt_in_features", "strategy_hardware", "hardware_overrides",
        "strategy_overrides", mode="before",
    )
    @classmethod
    def _none_is_empty_map(cls, v: Any) -> Any:
        return {} if v is None else v

    @field_validator("opt_in_features", "compatible_strategies", mode="before")
    @classmethod
    def _none_is_empty_list(cls, v: Any) -> Any:
        return [] if v is None else v

    @field_validator("features", mode="before")
    @classmethod
    def _features(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: ({} if f is None else f) for k, f in v.items()}
        return v

    @field_validator("variants")
    @classmethod
    def _variants(cls, variants: dict[str, Variant]) -> dict[str, Variant]:
        if not variants:
            raise ValueError("a recipe needs at least one variant")
        return variants

    @property
    def slug(self) -> str:
        if self.meta.slug:
            return self.meta.slug
        return self.model.model_id.rsplit("/", 1)[-1].lower()

    def variant(self, key: str) -> Variant:
        """``variants[key] || variants.default || {}`` as the builder reads it."""
        v = self.variants.get(key) or self.variants.get("default")
        return v if v is not None else Variant()


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse_recipe(text: str, source: str = "<recipe>") -> Recipe:
    """Parse and validate recipe text; errors name ``source``, the line (YAML) or the key path."""
    try:
        data = yamlfile.parse(text, source)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = exc.problem or exc.context or "invalid YAML"
        raise RecipeError(f"{where}: YAML syntax error: {problem}: fix the YAML at that line") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{source}: YAML error: {exc}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe is a YAML mapping (meta, model, variants, ...); "
                          f"got {type(data).__name__}")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        path = _loc(err["loc"])
        msg = err["msg"]
        if err["type"] == "missing":
            raise RecipeError(f"{source}: required key '{path}' is missing: add it to the recipe") from None
        got = err.get("input")
        shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
        hint = ""
        if err["type"] == "string_type" and isinstance(got, (int, float)):
            hint = f" (quote it: \"{got}\")"
        raise RecipeError(f"{source}: {path}: {msg}, got {shown}{hint}") from None
    recipe.source = source
    return recipe


def load_recipe(path: str | os.PathLike[str] | None = None) -> Recipe:
    """Load a recipe file; ``None`` loads the vendored Kimi-K3 recipe.

    Example::

        >>> load_recipe("recipes/kimi-k3.yaml").default_strategy
        'single_node_tp'
    """
    p = Path(path) if path is not None else VENDORED_RECIPE
    shown = str(path) if path is not None else "recipes/kimi-k3.yaml"
    try:
        text = yamlfile.read(p, shown)
    except FileNotFoundError:
        raise RecipeError(f"recipe file {shown} not found: pass an existing file with --recipe PATH") from None
    except IsADirectoryError:
        raise RecipeError(f"recipe path {shown} is a directory: pass a recipe YAML file with --recipe PATH") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"recipe file {shown} cannot be read: {exc}") from None
    return parse_recipe(text, shown)
