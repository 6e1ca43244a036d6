"""The JAX boundary: the one place that touches JAX internals or JAX's wording.

polyjit reads jaxprs, symbolic dimension expressions and source locations, and
binds primitives directly. Public APIs (`jax.export`, `jax.extend.core`) are
used where they exist; everything private is wrapped in this subpackage so
that a JAX upgrade touches it alone. Nothing outside it imports from
`jax._src`, `jax.interpreters`, `jax.core` or `jax.extend.core`, reads a
private attribute of JAX's objects, or parses a text of JAX's (error messages,
cache-miss explanations, monitoring event and program names). The rest of
polyjit imports this package as `jc` and uses the names re-exported here.
This subpackage imports nothing of polyjit's outside it.

Modules (dependencies point up the list):
  registry    one row per JAX internal polyjit relies on, with its probe (imports
              nothing); `JaxBoundaryError`
  core        JAX's version, jaxpr data structures, the call path, jaxpr helpers
  dims        symbolic dimension accessors (`jax.export`'s `_DimExpr`)
  frames      source locations; which frames are the user's
  set_sites   whether a set user code builds of sizes may skip their values
  decisions   size comparisons asked by user code (hooks on `DimExpr`)
  primitives  JAX's primitives by name; polyjit's size primitives
  calls       polyjit's call primitive (the masked evaluation and its derivatives)
  patches     the permanent patches, installed once by `install_patches()`
  messages    parsers of JAX's texts (cache misses, compile events, errors)
  swaps       JAX functions replaced for the duration of a symbolic trace
  compilation_cache  polyjit's programs as bytes: their key, serialization and load
  inline_cpu  polyjit's small programs on a synchronous CPU client of its own
  probes      the probes of the registry's rows (run once, before use); probes_texts
              those of the JAX texts polyjit parses

Tested against JAX 0.10.2 (full suite), 0.11.2 once, and 0.9.2 in part (see
`core` for the version differences, docs/jax-boundary.md for the audit).
"""
from __future__ import annotations

from .core import (
    ARRAY_TYPE as ARRAY_TYPE, JAX_VERSION as JAX_VERSION,
    LAPACK_BATCHES_BLOCK_THE_POOL as LAPACK_BATCHES_BLOCK_THE_POOL,
    PRIMITIVES_NEWER_THAN_THIS_JAX as PRIMITIVES_NEWER_THAN_THIS_JAX,
    ClosedJaxpr as ClosedJaxpr, InconclusiveDimensionOperation as InconclusiveDimensionOperation,
    Jaxpr as Jaxpr, JaxprEqn as JaxprEqn, Literal as Literal, Primitive as Primitive,
    Tracer as Tracer, max_dim as max_dim, min_dim as min_dim,
    convert_constvars_jaxpr as convert_constvars_jaxpr,
    default_device as default_device, default_sharding as default_sharding, host_to_device as host_to_device,
    explicitly as explicitly, explicitly_read as explicitly_read,
    transfers_guarded as transfers_guarded, guard_user_uploads as guard_user_uploads,
    jit_disabled as jit_disabled, in_callers_config as in_callers_config,
    is_dropvar as is_dropvar, jaxpr_as_fun as jaxpr_as_fun,
    make_closed_jaxpr as make_closed_jaxpr, promote_dtypes_inexact as promote_dtypes_inexact,
    promote_dtypes as promote_dtypes,
    replay_unsafe_effects as replay_unsafe_effects, shaped as shaped,
    uncanonical as uncanonical, canonical_dtype as canonical_dtype, zeros as zeros,
    convert_weak as convert_weak,
    subjaxprs_in_params as subjaxprs_in_params, trace_context as trace_context,
    typeof as typeof, custom_jvp_rule_jaxpr as custom_jvp_rule_jaxpr,
    vmap_trace_of as vmap_trace_of)
from .dims import (
    DimExpr as DimExpr, SymbolicScope as SymbolicScope, dim_scope as dim_scope,
    dim_terms as dim_terms, dim_value_dtype as dim_value_dtype, dim_variable as dim_variable,
    evaluate_symbolic as evaluate_symbolic, factor_parts as factor_parts,
    is_symbolic_dim as is_symbolic_dim, symbolic_shape as symbolic_shape,
    symbolic_vars as symbolic_vars)
from .decisions import (
    SizeDecision as SizeDecision, dim_bounds as dim_bounds,
    scope_constraints as scope_constraints, signal_raised as signal_raised,
    size_decisions as size_decisions, question_line as question_line)
from .float_checks import (
    InternalFloatingPointError as InternalFloatingPointError, float_checks as float_checks,
    float_checks_off as float_checks_off, floats_found as floats_found)
from .frames import (
    current_user_line as current_user_line, eqn_context as eqn_context,
    is_polyjit_path as is_polyjit_path, is_user_path as is_user_path,
    passed_user_code as passed_user_code, user_code_can_catch as user_code_can_catch,
    stacklevel_outside_polyjit as stacklevel_outside_polyjit,
    stacklevel_at_user_code as stacklevel_at_user_code,
    library_function_of as library_function_of, source_line as source_line,
    innermost_jax_function as innermost_jax_function,
    static_size_user as static_size_user,
    user_line_of as user_line_of)
from .primitives import (
    EVAL_JAXPR_IS_THE_CALL as EVAL_JAXPR_IS_THE_CALL, hi_primitive_expansion as hi_primitive_expansion, NUMPY_BINDS_HI_PRIMITIVES as NUMPY_BINDS_HI_PRIMITIVES, all_primitives as all_primitives, bind_params as bind_params, primitive as primitive,
    required_primitive as required_primitive, scan_counts as scan_counts,
    size_primitive as size_primitive, uncached_calls as uncached_calls,
    ruled_primitive as ruled_primitive, is_undefined_primal as is_undefined_primal,
    shaped_array as shaped_array,
    with_scan_counts as with_scan_counts)
from .calls import (CallNode as CallNode, bind_call as bind_call,
                    set_lowering_order as set_lowering_order)
from .patches import (
    install_patches as install_patches, instantiate_zeros as instantiate_zeros,
    is_zero_tangent as is_zero_tangent, wrap_custom_jvp_rule as wrap_custom_jvp_rule,
    wrap_jvp_rule as wrap_jvp_rule, wrap_transpose_rules as wrap_transpose_rules)
from .messages import (
    transfer_refused as transfer_refused,
    BACKEND_COMPILE_EVENT as BACKEND_COMPILE_EVENT, CACHE_HIT_EVENT as CACHE_HIT_EVENT,
    CacheMiss as CacheMiss, cache_miss_loggers as cache_miss_loggers,
    compile_event_function as compile_event_function,
    explain_cache_misses as explain_cache_misses, function_of_program as function_of_program,
    inconclusive_comparison as inconclusive_comparison,
    is_cache_miss_explanation as is_cache_miss_explanation,
    is_while_loop_vjp_refusal as is_while_loop_vjp_refusal,
    jit_program_name as jit_program_name, needs_concrete_size as needs_concrete_size,
    parse_cache_miss as parse_cache_miss, trace_refusal as trace_refusal)
from .swaps import (
    ARRAY_GETITEM as ARRAY_GETITEM, CONVOLVE_ND as CONVOLVE_ND, TRIU_SIZE as TRIU_SIZE,
    CONV_1D as CONV_1D, SWAP_SITES as SWAP_SITES,
    as_called_by_name as as_called_by_name,
    original_of as original_of,
    register_spellings as register_spellings, replacement_of as replacement_of,
    spellings_active as spellings_active, trace_spellings as trace_spellings)
from .compilation_cache import (
    ProgramMismatch as ProgramMismatch, calling_convention as calling_convention,
    config_values as config_values, default_device_chosen as default_device_chosen,
    load_program as load_program,
    program_key as program_key, serialize_program as serialize_program)
from .inline_cpu import (
    inline_copy as inline_copy, inline_device as inline_device,
    inline_sharding as inline_sharding, program_cost as program_cost,
    to_default as to_default, to_inline as to_inline)
from .registry import (
    AUDITED as AUDITED, NEWEST_TESTED as NEWEST_TESTED, TESTED as TESTED,
    JaxBoundaryError as JaxBoundaryError, require as require)
from . import compile_time as compile_time, probes as probes, registry as registry
from . import probes_texts as probes_texts
