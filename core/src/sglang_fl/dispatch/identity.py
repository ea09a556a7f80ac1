"""Who an implementation belongs to: vendor names and impl-id namespaces follow the entry point.

A plugin's identity is its entry-point name in ``sglang_fl.backends``: the name users write
in ``SGLANG_FL_PLUGINS``, ``SGLANG_FL_DISABLE_PLUGINS``, ``SGLANG_FL_ALLOW_VENDORS``,
``SGLANG_FL_DENY_VENDORS`` and ``vendor:<name>``. The loader stamps it on every registration
(:class:`~sglang_fl.dispatch.types.Provenance`); what a plugin declares about itself must agree:

- ``vendor``, when given, is the plugin's entry-point name;
- an ``impl_id`` is ``<kind>.<entry-point name>`` or starts with ``<kind>.<entry-point name>.``
  (``vendor.cuda``, ``flagos.cuda.fast``), so no plugin can take another's impl ids;
- the vendor lists match the entry-point name of the plugin that registered an implementation,
  whatever its kind, so a ``flagos`` implementation without a vendor is still its plugin's.

Core's reference backend (plugin ``reference`` of ``sglang-fl``) and registrations made outside
any plugin (``<direct>``: tests, interactive use) are outside the rule; no entry point can take
either name (``reference`` is refused by the loader, ``<direct>`` is not a valid name).
"""

from __future__ import annotations

from .types import OpImpl, Provenance

__all__ = [
    "CORE_DISTRIBUTION",
    "DIRECT_PLUGIN",
    "IDENTITY_RULE",
    "REFERENCE_PLUGIN",
    "identity_problem",
    "impl_id_namespace",
    "is_core_reference",
    "vendor_identity",
]

CORE_DISTRIBUTION = "sglang-fl"
REFERENCE_PLUGIN = "reference"
DIRECT_PLUGIN = "<direct>"
# One sentence, as `sglang-fl plugins` and the refusals state it.
IDENTITY_RULE = (
    "a plugin is its entry-point name: its vendor= is that name, its impl_ids are "
    "<kind>.<name> or start with <kind>.<name>., and SGLANG_FL_ALLOW_VENDORS / "
    "SGLANG_FL_DENY_VENDORS match that name for every implementation it registers"
)


def is_core_reference(provenance: Provenance) -> bool:
    """Whether ``provenance`` is core's reference backend, or a direct registration (the host
    program's own code): the only registrants of kind ``reference``."""
    if provenance.plugin == DIRECT_PLUGIN:
        return True
    return provenance.plugin == REFERENCE_PLUGIN and provenance.distribution == CORE_DISTRIBUTION


def _outside_rule(provenance: Provenance) -> bool:
    """Core's reference backend and direct registrations: no entry point can claim either."""
    return is_core_reference(provenance)


def impl_id_namespace(impl: OpImpl, plugin: str) -> str:
    """The impl-id prefix ``plugin`` owns for ``impl``'s kind, e.g. ``vendor.cuda``."""
    return f"{impl.kind}.{plugin}"


def identity_problem(impl: OpImpl, provenance: Provenance) -> str | None:
    """Why ``impl`` contradicts the identity of the plugin registering it, or ``None``."""
    if _outside_rule(provenance):
        return None
    plugin = provenance.plugin
    who = f"plugin {plugin!r} ({provenance.distribution})"
    if impl.vendor is not None and impl.vendor != plugin:
        return (
            f"{who} registered {impl.impl_id!r} with vendor={impl.vendor!r}; a plugin's vendor "
            f"name is its entry-point name, {plugin!r}"
        )
    namespace = impl_id_namespace(impl, plugin)
    if impl.impl_id != namespace and not impl.impl_id.startswith(namespace + "."):
        return (
            f"{who} registered impl_id {impl.impl_id!r} ({impl.kind}); its impl_ids must be "
            f"{namespace!r} or start with {namespace + '.'!r} (the kind, then the plugin's "
            "entry-point name)"
        )
    return None


def vendor_identity(impl: OpImpl) -> str | None:
    """The name ``SGLANG_FL_ALLOW_VENDORS``/``DENY_VENDORS`` match for ``impl``.

    The registering plugin's entry-point name (its ``vendor``, by the rule above), whatever the
    kind; ``None`` for core's reference backend, which the vendor lists never exclude. A direct
    registration is matched by the ``vendor`` it declares.
    """
    provenance = impl.provenance
    if provenance is None or provenance.plugin == DIRECT_PLUGIN:
        return impl.vendor
    if _outside_rule(provenance):
        return None
    return provenance.plugin
