"""specula_sd (distribution ``specula-sd``): specula's speculative-sampling verifiers for NumPy
and PyTorch engines. Not the unrelated PyPI project ``specula`` (docs/python.md).

Every function here calls specula's C++ entry points (``specula/verify.hpp``) on the caller's
arrays in place (DLPack or the buffer protocol, no conversion): the results are those of the
C++ call bit for bit, depend only on each request's inputs and its random stream
``(seed, request_id, step)`` -- never on its position in the batch -- and outputs are written
into arrays the caller may provide. Arrays are NumPy arrays or PyTorch tensors on the CPU;
outputs are allocated like the first array argument (torch in, torch out). See docs/python.md.

Invalid input raises :class:`InvalidInput` (a ``ValueError``) with the C++ message, e.g.
``specula: draft_probs[row 3][column 17]: negative probability (value -0.25)``; a wrong dtype
raises ``TypeError``, a non-contiguous array or one on another device ``ValueError``, each
naming the argument.
"""

from ._specula import (  # noqa: F401  (re-exported)
    InvalidInput,
    NeighbourTable,
    Rule,
    Schedule,
    __version__,
    custom_schedule,
    exact_rule,
    exponential_schedule,
    lantern_rule,
    linear_schedule,
    neighbour_table,
    neighbour_table_from_ids,
    relaxed_rule,
    scheduled_rule,
    typical_rule,
    uniform_schedule,
)
import sys

from . import _specula as _ext

__all__ = [
    "InvalidInput", "NeighbourTable", "Rule", "Schedule", "__version__",
    "chain_speculative_sampling", "rejection_sample", "greedy_chain", "verify_tree",
    "greedy_tree", "verify_candidates", "logits_to_probs",
    "exact_rule", "relaxed_rule", "scheduled_rule", "lantern_rule", "typical_rule",
    "uniform_schedule", "exponential_schedule", "linear_schedule", "custom_schedule",
    "neighbour_table", "neighbour_table_from_ids",
    "CHAIN_VALID", "CHAIN_BONUS", "CHAIN_RESIDUAL_FALLBACK",
]

# chain_flags (specula/verify/chain_core.hpp), as written into a `flags` output.
CHAIN_VALID = 1
CHAIN_BONUS = 2
CHAIN_RESIDUAL_FALLBACK = 4

_DEFAULT_SUM_TOLERANCE = 1e-3
_DEFAULT_RESIDUAL_FLOOR = 1e-6


try:
    import numpy as _np
except ImportError:  # NumPy is optional for torch users
    _np = None


def _is_torch(x):
    return type(x).__module__[:5] == "torch"


# Whether this build routes CUDA tensors of the chain verifiers to specula::cuda
# (-Ccmake.define.SPECULA_PYTHON_CUDA=ON; docs/python.md).
_HAS_CUDA = bool(getattr(_ext, "_has_cuda", False))


def _new(like, shape, dtype, fill=None):
    """A new array of `shape` and `dtype` (a NumPy dtype name) of the framework of `like` (on
    its CUDA device when it is a CUDA tensor and this build has CUDA, else on the CPU)."""
    if _is_torch(like):
        torch = sys.modules["torch"]
        t = getattr(torch, dtype)
        if _HAS_CUDA and like.is_cuda:
            return torch.full(shape, -1 if fill is None else fill, dtype=t, device=like.device)
        return torch.empty(shape, dtype=t) if fill is None else torch.full(shape, fill, dtype=t)
    if _np is None:
        raise TypeError("specula: outputs for non-torch inputs are NumPy arrays: install numpy")
    return _np.empty(shape, dtype) if fill is None else _np.full(shape, fill, dtype)


def _stream(like):
    """The current torch stream of a CUDA tensor's device, as an integer (0 otherwise)."""
    if _HAS_CUDA and _is_torch(like) and like.is_cuda:
        return sys.modules["torch"].cuda.current_stream(like.device).cuda_stream
    return 0


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _shape(x, name, ndims=None, expected=None):
    """The shape of an array argument: TypeError naming the argument for an object that is not
    an array (a list, a number), ValueError for a number of dimensions not in `ndims`
    (`expected`: the shape the message shows)."""
    shape = getattr(x, "shape", None)
    if shape is None or type(x) in (list, tuple):
        raise TypeError(f"specula: {name} must be a NumPy array or a PyTorch tensor (any object "
                        f"with __dlpack__ or the buffer protocol), not {type(x).__name__}")
    if ndims is not None and len(shape) not in ndims:
        raise ValueError(f"specula: {name} must have shape {expected} (got {len(shape)} "
                         f"dimension{'' if len(shape) == 1 else 's'}: {tuple(shape)})")
    return shape


def _require_integer(x, name):
    """TypeError naming the argument unless the array `x` has an integer dtype."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return
    if _is_torch(x):
        ok = not (dtype.is_floating_point or dtype.is_complex) and dtype != sys.modules["torch"].bool
    else:
        ok = getattr(dtype, "kind", "i") in "iu"
    if not ok:
        raise TypeError(f"specula: {name} must have dtype int32 or int64 (got "
                        f"{_dtype_name(dtype)})")


def _max_drafts(cu, batch):
    """Largest draft count of a flattened batch from cu_num_draft_tokens (B or B + 1 entries)."""
    _require_integer(cu, "cu_num_draft_tokens")
    if batch == 0:
        return 0
    if _is_torch(cu):
        c = cu.tolist()
    else:
        c = [int(v) for v in cu]
    if len(c) == batch:
        c = [0] + c
    return max((c[i + 1] - c[i] for i in range(len(c) - 1)), default=0)


def _flat_outputs(target, draft_token_ids, cu, bonus, max_spec_len, output_token_ids,
                  num_accepted, greedy=False):
    """Outputs of a flattened-layout call: (B, max_spec_len + 1) tokens and (B,) counts."""
    target_name = "target_logits" if greedy else "target_probs"
    n = _shape(draft_token_ids, "draft_token_ids", (1,), "(num_draft_tokens,)")[0]
    rows = _shape(target, target_name, (2,), "(num_draft_tokens + B, V)")[0]
    if bonus is not None:
        b = _shape(bonus, "bonus_token_ids", (1, 2), "(B,) or (B, 1)")[0]
    else:
        b = max(rows - n, 0)
    if output_token_ids is None:
        if max_spec_len is None:
            max_spec_len = _max_drafts(cu, b)
        output_token_ids = _new(target, (b, max_spec_len + 1), "int32")
    if num_accepted is None:
        num_accepted = _new(target, (b,), "int32")
    return output_token_ids, num_accepted


def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs,
                               maybe_output_accepted_token_num=None,
                               maybe_output_emitted_draft_token_num=None,
                               deterministic=True, generator=None, *, seeds, steps,
                               request_ids=0, draft_lengths=None, rule=None,
                               output_token_ids=None, accepted=None, flags=None,
                               sum_tolerance=_DEFAULT_SUM_TOLERANCE,
                               residual_floor=_DEFAULT_RESIDUAL_FLOOR, check="reads",
                               placeholders="refuse", threads=1):
    """Chain verification in FlashInfer's padded layout and argument order.

    draft_probs: (B, L, V) float32/float64, or None for one-hot drafts (greedy / n-gram
    drafting); draft_token_ids: (B, L) int32 (int64 is accepted and copied), -1 after a
    request's drafts; target_probs: (B, L + 1, V). Returns ``(output_token_ids,
    output_accepted_token_num, output_emitted_draft_token_num)``: (B, L + 1) int32 tokens
    (accepted drafts, then the correction or bonus token, then -1) and two (B,) int32 counts.
    As in FlashInfer, counts are added in place to the ``maybe_output_*`` arrays when given.
    specula stops at the first rejection, so ``output_accepted_token_num`` receives the same
    count as ``output_emitted_draft_token_num`` (FlashInfer's independent per-position
    acceptance statistic is not computed).

    seeds, steps, request_ids: integers, or (B,) integer arrays, forming request b's random
    stream ``(seeds[b], request_ids[b], steps[b])``; change ``steps`` at every decoding
    iteration. ``deterministic`` is accepted for compatibility (specula always is);
    ``generator`` must be None. ``placeholders``: what a -1 inside a request's counted drafts
    (with ``draft_lengths``) does: ``"refuse"`` (ValueError) or ``"reject"`` (vLLM's rule: the
    draft is rejected at that position and a token is sampled there).
    """
    if generator is not None:
        raise TypeError("specula: generator is not used: randomness comes from seeds, "
                        "request_ids and steps (per request)")
    b, width = _shape(draft_token_ids, "draft_token_ids", (2,), "(B, L)")
    width += 1
    if output_token_ids is None:
        output_token_ids = _new(target_probs, (b, width), "int32")
    n = _new(target_probs, (b,), "int32")
    _ext._chain_padded(draft_probs, draft_token_ids, target_probs, draft_lengths, seeds,
                       request_ids, steps, output_token_ids, n, accepted, flags, rule,
                       sum_tolerance, residual_floor, check, placeholders, threads,
                       _stream(target_probs))
    if maybe_output_accepted_token_num is not None:
        maybe_output_accepted_token_num += n
        accepted_num = maybe_output_accepted_token_num
    else:
        accepted_num = n
    if maybe_output_emitted_draft_token_num is not None:
        maybe_output_emitted_draft_token_num += n
        emitted_num = maybe_output_emitted_draft_token_num
    else:
        emitted_num = n.clone() if _is_torch(n) else n.copy()
    return output_token_ids, accepted_num, emitted_num


def rejection_sample(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs,
                     bonus_token_ids=None, *, seeds, steps, request_ids=0, max_spec_len=None,
                     rule=None, is_greedy=None, output_token_ids=None, num_accepted=None,
                     accepted=None, flags=None, sum_tolerance=_DEFAULT_SUM_TOLERANCE,
                     residual_floor=_DEFAULT_RESIDUAL_FLOOR, check="reads",
                     placeholders="refuse", threads=1):
    """Chain verification in vLLM's flattened layout.

    draft_token_ids: (num_draft_tokens,) int32 (int64 copied); cu_num_draft_tokens: vLLM's
    (B,) cumulative draft counts, or the same with a leading 0 (B + 1 entries), int32 or int64;
    draft_probs: (num_draft_tokens, V) or None (one-hot drafts, vLLM's ngram/EAGLE case);
    target_probs: (num_draft_tokens + B, V): request b's L_b draft positions followed by its
    bonus position, i.e. the rows of vLLM's logits before they are split into target and bonus
    logits; the bonus token is sampled by specula from the bonus row. Or, with
    ``bonus_token_ids`` ((B,) or (B, 1) int32/int64: the bonus tokens the engine sampled, as
    vLLM passes them), target_probs is (num_draft_tokens, V), one row per draft token (vLLM's
    layout), and a request whose drafts are all accepted appends its bonus token.

    Returns output_token_ids: (B, max_spec_len + 1) int32 with -1 padding, as vLLM's
    rejection_sample; pass an array of shape (num_draft_tokens + B,) as ``output_token_ids``
    to receive specula's flattened layout instead (written in place, no scatter).
    ``num_accepted`` (B,) int32 receives the accepted draft counts when given.

    ``is_greedy``: None, or a (B,) bool mask (vLLM's per-request greedy flags): those requests
    are verified by the greedy rule (argmax of their target rows, as :func:`greedy_chain`), the
    others by sampling; each request's result is that of a call of its own kind.
    ``placeholders``: a -1 inside a request's counted drafts is refused (``"refuse"``,
    ValueError) or, with ``"reject"``, rejected at that position with a token sampled there
    (vLLM's rule for its placeholder draft id).
    """
    output_token_ids, num_accepted = _flat_outputs(
        target_probs, draft_token_ids, cu_num_draft_tokens, bonus_token_ids, max_spec_len,
        output_token_ids, num_accepted)
    if _is_torch(is_greedy) and is_greedy.dtype == sys.modules["torch"].bool:
        is_greedy = is_greedy.to(sys.modules["torch"].uint8)  # torch < 2 exports no bool
    _ext._chain_flat(draft_probs, draft_token_ids, cu_num_draft_tokens, target_probs,
                     bonus_token_ids, seeds, request_ids, steps, output_token_ids, num_accepted,
                     accepted, flags, rule, sum_tolerance, residual_floor, check, placeholders,
                     threads, False, is_greedy, _stream(target_probs))
    return output_token_ids


def greedy_chain(draft_token_ids, cu_num_draft_tokens, target_logits, bonus_token_ids=None, *,
                 max_spec_len=None, output_token_ids=None, num_accepted=None, accepted=None,
                 flags=None, placeholders="refuse", threads=1):
    """Greedy chain verification (argmax of each target row, lowest index on ties) in vLLM's
    flattened layout: arguments and output as :func:`rejection_sample` (``target_logits`` may be
    logits or probabilities, float32/float64; NaN is rejected)."""
    output_token_ids, num_accepted = _flat_outputs(
        target_logits, draft_token_ids, cu_num_draft_tokens, bonus_token_ids, max_spec_len,
        output_token_ids, num_accepted, greedy=True)
    _ext._chain_flat(None, draft_token_ids, cu_num_draft_tokens, target_logits, bonus_token_ids,
                     0, 0, 0, output_token_ids, num_accepted, accepted, flags, None,
                     _DEFAULT_SUM_TOLERANCE, _DEFAULT_RESIDUAL_FLOOR, "reads", placeholders,
                     threads, True, None, _stream(target_logits))
    return output_token_ids


def _tree_outputs(parents, like, node_offsets, output_tokens, num_accepted, accepted_nodes):
    shape = _shape(parents, "parents", (1, 2), "(B, n) or (N,)")
    if len(shape) == 2:
        b = shape[0]
    elif node_offsets is not None:
        b = _shape(node_offsets, "node_offsets", (1,), "(B + 1,)")[0] - 1
    else:
        b = 1
    if output_tokens is None:
        output_tokens = _new(like, tuple(shape), "int32")
    if num_accepted is None:
        num_accepted = _new(like, (b,), "int32")
    if accepted_nodes is None:
        accepted_nodes = _new(like, tuple(shape), "int64")
    return output_tokens, num_accepted, accepted_nodes


def verify_tree(parents, tokens, target_probs, draft_probs=None, *, seeds, steps, request_ids=0,
                node_offsets=None, rule=None, sampling="without_replacement",
                output_tokens=None, num_accepted=None, accepted_nodes=None, flags=None,
                sum_tolerance=_DEFAULT_SUM_TOLERANCE, residual_floor=_DEFAULT_RESIDUAL_FLOOR,
                check="reads", threads=1):
    """Token-tree verification (SpecInfer / EAGLE / SJD-PAC trees).

    parents, tokens: (B, n) arrays (every request's tree has n nodes) or (N,) arrays of all
    nodes with ``node_offsets`` (B + 1 entries; omitted: one tree). Node 0 of each tree is its
    root (parent -1, token unused); other parents are local indices < the node's own.
    target_probs: one row per node, (B, n, V) or (N, V); draft_probs: the same shape (row u is
    what u's children were drawn from) or None (deterministic children). ``sampling``: how
    siblings were drawn ('without_replacement' or 'with_replacement').

    Returns ``(output_tokens, num_accepted, accepted_nodes)``: per request, the accepted path's
    tokens then the emitted token then -1 (shaped like parents, int32); accepted draft nodes
    (B,) int32; accepted node indices, root first, then -1 (int64).
    """
    output_tokens, num_accepted, accepted_nodes = _tree_outputs(
        parents, target_probs, node_offsets, output_tokens, num_accepted, accepted_nodes)
    _ext._tree(parents, tokens, node_offsets, target_probs, draft_probs, seeds, request_ids,
               steps, output_tokens, num_accepted, accepted_nodes, flags, rule, sampling,
               sum_tolerance, residual_floor, check, threads, False)
    return output_tokens, num_accepted, accepted_nodes


def greedy_tree(parents, tokens, target_logits, *, node_offsets=None, output_tokens=None,
                num_accepted=None, accepted_nodes=None, flags=None, threads=1):
    """Greedy tree verification: follow the child whose token is the argmax of its parent's
    target row. Arguments and outputs as :func:`verify_tree`."""
    output_tokens, num_accepted, accepted_nodes = _tree_outputs(
        parents, target_logits, node_offsets, output_tokens, num_accepted, accepted_nodes)
    _ext._tree(parents, tokens, node_offsets, target_logits, None, None, None, None,
               output_tokens, num_accepted, accepted_nodes, flags, None, "without_replacement",
               _DEFAULT_SUM_TOLERANCE, _DEFAULT_RESIDUAL_FLOOR, "reads", threads, True)
    return output_tokens, num_accepted, accepted_nodes


def verify_candidates(target_probs, candidates, draft_probs=None, *, seeds, steps,
                      request_ids=0, position=0, with_replacement=False, rule=None,
                      accepted_index=None, tokens=None, flags=None,
                      sum_tolerance=_DEFAULT_SUM_TOLERANCE,
                      residual_floor=_DEFAULT_RESIDUAL_FLOOR, check="reads", threads=1):
    """K candidates at one position per request (multi-draft / SpecInfer-style).

    target_probs: (B, V); candidates: (B, K) int32 (int64 copied), drawn from draft_probs
    (B, V) without replacement (distinct) or, with ``with_replacement=True``, i.i.d.; None:
    deterministic candidates. ``position``: the draw position in the request's stream (an
    integer or (B,) array; a tree node of depth d verifies at position d).

    Returns ``(accepted_index, tokens)``: (B,) int64 index of the accepted candidate or -1, and
    (B,) int32 emitted token (the accepted candidate or the residual sample).
    """
    b = _shape(candidates, "candidates", (2,), "(B, K)")[0]
    if accepted_index is None:
        accepted_index = _new(target_probs, (b,), "int64")
    if tokens is None:
        tokens = _new(target_probs, (b,), "int32")
    _ext._candidates(target_probs, candidates, draft_probs, seeds, request_ids, steps, position,
                     with_replacement, accepted_index, tokens, flags, rule, sum_tolerance,
                     residual_floor, check, threads)
    return accepted_index, tokens


def logits_to_probs(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, uncond=None,
                    cfg_scale=1.0, out=None, threads=1):
    """Logits -> probabilities: CFG mix (with ``uncond``), temperature, top-k, softmax, top-p,
    min-p, each filter renormalising. logits: (..., V) float32, bfloat16 or float16, never
    written; each parameter a number (every row) or a (rows,) array (one per row). Returns
    float32 probabilities of the logits' shape (written into ``out`` when given; it must not
    overlap the logits). A per-row parameter may also be a list or tuple (read as a NumPy
    array)."""
    if _np is not None:
        temperature, top_k, top_p, min_p, cfg_scale = (
            _np.asarray(x) if type(x) in (list, tuple) else x
            for x in (temperature, top_k, top_p, min_p, cfg_scale))
    if out is None:
        out = _new(logits, tuple(_shape(logits, "logits")), "float32")
    _ext._logits_to_probs(logits, uncond, temperature, top_k, top_p, min_p, cfg_scale, out,
                          threads)
    return out
