"""Bad inputs: the C++ invalid_input messages as ValueError (specula.InvalidInput), and dtype,
contiguity, device and argument errors naming the argument."""

import ctypes

import numpy as np
import pytest

import specula_sd as specula

try:
    import torch
except ImportError:
    torch = None


def chain_args(batch=2, length=2, vocab=4):
    q = np.full((batch, length, vocab), 1.0 / vocab, np.float32)
    p = np.full((batch, length + 1, vocab), 1.0 / vocab, np.float32)
    d = np.zeros((batch, length), np.int32)
    return q, d, p


def call(q, d, p, **kw):
    kw.setdefault("seeds", np.arange(d.shape[0]))
    kw.setdefault("steps", 0)
    return specula.chain_speculative_sampling(q, d, p, **kw)


def test_invalid_input_is_a_value_error_with_the_cpp_message():
    q, d, p = chain_args()
    q[1, 0, 2] = -0.25
    with pytest.raises(specula.InvalidInput) as e:
        call(q, d, p, check="full")
    assert isinstance(e.value, ValueError)
    assert str(e.value) == ("specula: draft_probs[row 2][column 2]: negative probability "
                            "(value -0.25)")


def test_token_out_of_range_and_padding():
    q, d, p = chain_args()
    d[1, 1] = 4
    with pytest.raises(ValueError, match=r"^specula: draft_tokens\[row 1\]\[column 1\]: .*"
                                         r"vocab_size is 4"):
        call(q, d, p)
    d[1, 1] = -1
    d[1, 0] = -1
    call(q, d, p)   # -1 padding after the drafts (request 1 has none) is fine
    d[0, 0] = -1
    d[0, 1] = 2
    with pytest.raises(ValueError, match=r"draft_tokens\[row 0\]\[column 1\].*must be -1"):
        call(q, d, p)


def test_row_count_mismatch():
    q, d, p = chain_args()
    with pytest.raises(ValueError, match="target_probs"):
        call(q, d, p[:, :2])
    with pytest.raises(ValueError, match="draft_probs"):
        call(q[:, :1], d, p)


def test_flattened_layout_errors():
    tokens = np.array([0, 1, 2], np.int32)
    target = np.full((5, 4), 0.25, np.float32)
    with pytest.raises(ValueError, match="cu_num_draft_tokens must have B or B \\+ 1 entries"):
        specula.rejection_sample(tokens, np.array([0, 1, 2, 3]), None, target, seeds=[1, 2],
                                 steps=0)
    # B + 1 entries are offsets with a leading 0 (specula's draft_offsets).
    with pytest.raises(ValueError, match=r"B \+ 1 entries \(B = rows of target_probs - number "
                                         r"of draft tokens = 2\) but does not start with 0"):
        specula.rejection_sample(tokens, np.array([1, 2, 3]), None, target, seeds=[1, 2],
                                 steps=0, max_spec_len=3)
    with pytest.raises(ValueError, match=r"^specula: draft_offsets\[row 2\]: .*non-decreasing"):
        specula.rejection_sample(tokens, np.array([0, 3, 2]), None, target, seeds=[1, 2],
                                 steps=0, max_spec_len=3)
    # vLLM's B cumulative counts are named as the caller passed them, at the caller's index.
    with pytest.raises(ValueError, match=r"^specula: cu_num_draft_tokens\[1\]: cumulative draft "
                                         r"counts must be non-negative and non-decreasing "
                                         r"\(value 2 after 3\)"):
        specula.rejection_sample(tokens, np.array([3, 2]), None, target, seeds=[1, 2], steps=0,
                                 max_spec_len=3)
    with pytest.raises(ValueError, match=r"^specula: cu_num_draft_tokens\[0\]: .*\(value -1\)"):
        specula.rejection_sample(tokens, np.array([-1, 3]), None, target, seeds=[1, 2], steps=0,
                                 max_spec_len=3)
    with pytest.raises(ValueError, match="needs num_draft_tokens \\+ B rows"):
        specula.rejection_sample(tokens, np.array([3]), None, target[:2], seeds=1, steps=0,
                                 max_spec_len=3)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_wrong_probability_dtype_is_a_type_error(dtype):
    q, d, p = chain_args()
    with pytest.raises(TypeError, match=r"^specula: target_probs must have dtype float32, "
                                        r"float64, float16 or bfloat16 \(got int(32|64)\)"):
        call(q.astype(dtype), d, p.astype(dtype))
    with pytest.raises(TypeError, match="draft_probs must have the dtype of target_probs"):
        call(q.astype(np.float64), d, p)


def test_wrong_index_dtypes_are_type_errors():
    q, d, p = chain_args()
    with pytest.raises(TypeError, match="draft_token_ids must have dtype int32 or int64"):
        call(q, d.astype(np.float32), p)
    with pytest.raises(TypeError, match="output_token_ids must have dtype int32"):
        call(q, d, p, output_token_ids=np.empty((2, 3), np.int64))
    with pytest.raises(TypeError, match="seeds must have dtype"):
        call(q, d, p, seeds=np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="seeds must be an integer or a 1-D integer array"):
        call(q, d, p, seeds=1.5)


def test_non_contiguous_arrays_are_value_errors():
    q, d, p = chain_args(vocab=8)
    with pytest.raises(ValueError, match="draft_probs must be contiguous along its last"):
        call(q[..., ::2], d, p[..., ::2])
    wide = np.full((2, 3, 8), 0.25, np.float32)
    # Rows of V = 4 inside rows of 8: evenly spaced, read in place.
    call(np.full((2, 2, 4), 0.25, np.float32), d, wide[..., :4])
    with pytest.raises(ValueError, match="draft_token_ids must be C-contiguous"):
        call(q[..., :4], np.zeros((2, 4), np.int32)[:, ::2], wide[..., :4])
    with pytest.raises(ValueError, match="target_probs is not contiguous"):
        call(q[..., :4], d, np.full((3, 2, 4), 0.25, np.float32).transpose(1, 0, 2))


def test_not_an_array_is_a_type_error():
    q, d, p = chain_args()
    with pytest.raises(TypeError, match="target_probs must be a NumPy array or a PyTorch tensor"):
        call(q, d, p.tolist())


def test_shared_random_streams_are_refused():
    q, d, p = chain_args()
    with pytest.raises(ValueError, match="every request would draw the same random numbers"):
        specula.chain_speculative_sampling(q, d, p, seeds=1, steps=0)
    call(q, d, p, seeds=1, request_ids=np.array([0, 1], np.uint32))  # distinct ids: fine
    with pytest.raises(ValueError, match="steps must be in"):
        call(q, d, p, steps=-1)
    with pytest.raises(ValueError, match=r"request_ids\[1\] must be in"):
        call(q, d, p, seeds=1, request_ids=np.array([0, 2**40]))
    with pytest.raises(ValueError, match="steps must be an integer or have shape"):
        call(q, d, p, steps=np.zeros(3, np.int64))


def test_bad_options_and_rules():
    q, d, p = chain_args()
    with pytest.raises(ValueError, match="check must be 'reads' or 'full'"):
        call(q, d, p, check="some")
    with pytest.raises(ValueError, match=r"^specula: options.residual_floor: invalid parameter"):
        call(q, d, p, residual_floor=-1.0)
    with pytest.raises(TypeError, match="rule must be a specula rule"):
        call(q, d, p, rule="exact")
    with pytest.raises(ValueError, match="^specula: omega: invalid parameter"):
        specula.relaxed_rule(-1.0)
    with pytest.raises(ValueError, match="^specula: delta"):
        specula.uniform_schedule(0.0)
    with pytest.raises(ValueError, match="threads must be >= 0"):
        call(q, d, p, threads=-2)
    with pytest.raises(TypeError, match="generator is not used"):
        call(q, d, p, generator=object())


def test_tree_errors():
    p = np.full((3, 4), 0.25, np.float32)
    with pytest.raises(ValueError, match=r"^specula: parents\[row 2\]"):
        specula.verify_tree(np.array([-1, 0, 5]), np.array([-1, 1, 2], np.int32), p, seeds=0,
                            steps=0)
    with pytest.raises(ValueError, match=r"^specula: trees\[row 0\]\[column 1\]"):
        specula.verify_tree(np.array([-1, 0, 0]), np.array([-1, 9, 2], np.int32), p, seeds=0,
                            steps=0)
    with pytest.raises(ValueError, match="siblings drawn without replacement must have distinct"):
        specula.verify_tree(np.array([-1, 0, 0]), np.array([-1, 2, 2], np.int32), p, p,
                            seeds=0, steps=0)


def test_candidates_errors_name_the_request():
    p = np.full((2, 4), 0.25, np.float32)
    q = p.copy()
    q[1, 3] = 0.0
    cand = np.array([[0, 1], [2, 3]], np.int32)
    with pytest.raises(ValueError, match=r"^specula: q\[column 3\]: .*\[request 1: "):
        specula.verify_candidates(p, cand, q, seeds=[1, 2], steps=0, check="full")
    # p = q at candidate 2, accepted with probability 1: at check="reads" (the default) q(3) is
    # never read, so it is not checked, and the result is that of the repaired input.
    got = specula.verify_candidates(p, cand, q, seeds=[1, 2], steps=0)
    want = specula.verify_candidates(p, cand, p, seeds=[1, 2], steps=0)
    assert [np.asarray(g).tolist() for g in got] == [np.asarray(w).tolist() for w in want]
    q[1, 2] = 0.0  # the tested candidate: refused at either level
    for check in ("reads", "full"):
        with pytest.raises(ValueError, match=r"^specula: q\[column 2\]: .*\[request 1: "):
            specula.verify_candidates(p, cand, q, seeds=[1, 2], steps=0, check=check)


def test_logits_to_probs_errors():
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match=r"^specula: params.top_p\[row 1\]: invalid parameter"):
        specula.logits_to_probs(x, top_p=np.array([0.5, 1.5], np.float32))
    x[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"^specula: logits\[row 1\]\[column 2\]: NaN"):
        specula.logits_to_probs(x)
    with pytest.raises(TypeError, match=r"logits must have dtype float32, bfloat16 or float16"):
        specula.logits_to_probs(np.zeros((2, 4), np.float64))
    with pytest.raises(TypeError, match=r"probs must have dtype float32"):
        specula.logits_to_probs(np.zeros((2, 4), np.float32), out=np.zeros((2, 4)))
    # Rows without entries are refused as such.
    with pytest.raises(ValueError, match=r"^specula: logits: empty input; rows have no entries"):
        specula.logits_to_probs(np.zeros((2, 0), np.float32))
    # Per-row parameters as lists are read as arrays (and checked per row alike).
    with pytest.raises(ValueError, match=r"^specula: params.top_p\[row 1\]: invalid parameter"):
        specula.logits_to_probs(np.zeros((2, 4), np.float32), top_p=[0.5, 1.5])


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class FakeCudaArray:
    """A DLPack producer claiming to live on cuda:0 (what a CUDA tensor hands over), so the
    device check can be tested on a machine without a GPU. Its data is never read."""

    def __init__(self, shape):
        self._host = np.zeros(shape, np.float32)
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._managed = _DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = self._host.ctypes.data
        t.device = _DLDevice(2, 0)  # kDLCUDA
        t.ndim = len(shape)
        t.dtype = _DLDataType(2, 32, 1)  # float32
        t.shape = self._shape
        self.shape = tuple(shape)

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kwargs):
        if kwargs.get("max_version") is not None:
            raise TypeError("unversioned DLPack only")
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self._managed), b"dltensor", None)


@pytest.mark.skipif(specula._HAS_CUDA, reason="this build has the CUDA path")
def test_cuda_tensors_are_refused_by_a_cpu_only_build():
    q, d, p = chain_args()
    fake = FakeCudaArray(p.shape)
    with pytest.raises(ValueError, match=r"^specula: target_probs is on cuda:0, but this build "
                                         r"of the specula package runs on the CPU only"):
        call(q, d, fake, output_token_ids=np.empty((2, 3), np.int32))


@pytest.mark.skipif(not specula._HAS_CUDA, reason="this build has no CUDA path")
def test_cuda_build_device_checks_without_a_gpu():
    """A CUDA build checks devices before any CUDA call: arrays of one call on two devices, and
    CUDA arrays given to a CPU-only function, are refused naming the argument."""
    q, d, p = chain_args()
    fake = FakeCudaArray(p.shape)
    with pytest.raises(ValueError, match=r"^specula: draft_token_ids is on cpu, but "
                                         r"target_probs is on cuda:0: every array of a call "
                                         r"must be on the same device"):
        call(q, d, fake, output_token_ids=np.empty((2, 3), np.int32))
    with pytest.raises(ValueError, match=r"^specula: target_probs is on cuda:0, but this "
                                         r"function runs on the CPU only"):
        specula.verify_candidates(FakeCudaArray((2, 4)), np.zeros((2, 1), np.int32), seeds=[1, 2],
                                  steps=0)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_errors():
    q, d, p = chain_args()
    with pytest.raises(TypeError, match=r"target_probs must have dtype float32, float64, "
                                        r"float16 or bfloat16 \(got int32\)"):
        call(torch.from_numpy(q).int(), torch.from_numpy(d), torch.from_numpy(p).int())
    # bfloat16 rows are taken (widened exactly: test_engine_semantics.py).
    call(torch.from_numpy(q).bfloat16(), torch.from_numpy(d), torch.from_numpy(p).bfloat16())
    t = torch.from_numpy(np.full((2, 4, 3), 1 / 3, np.float32)).transpose(1, 2)
    with pytest.raises(ValueError, match="target_probs must be contiguous along its last"):
        call(torch.from_numpy(q), torch.from_numpy(d), t[:, :3])


# ---------------------------------------------------------------------------------------------
# Arguments of the wrong kind: TypeError / ValueError naming the argument and the expected form
# ---------------------------------------------------------------------------------------------

def test_one_dimensional_draft_token_ids():
    q, d, p = chain_args()
    with pytest.raises(ValueError, match=r"^specula: draft_token_ids must have shape \(B, L\) "
                                         r"\(got 1 dimension: \(2,\)\)"):
        call(q, d[0], p)
    with pytest.raises(ValueError, match=r"^specula: draft_token_ids must have shape "
                                         r"\(num_draft_tokens,\) \(got 2 dimensions"):
        specula.rejection_sample(d, np.array([2, 4]), None, p.reshape(-1, 4), seeds=[1, 2],
                                 steps=0)


def test_lists_are_type_errors():
    q, d, p = chain_args()
    with pytest.raises(TypeError, match=r"^specula: draft_token_ids must be a NumPy array or a "
                                        r"PyTorch tensor .*, not list"):
        specula.chain_speculative_sampling(q, d.tolist(), p, seeds=[1, 2], steps=0)
    with pytest.raises(TypeError, match=r"^specula: target_probs must be a NumPy array .*not list"):
        specula.rejection_sample(d.reshape(-1), np.array([2, 4]), None, p.reshape(-1, 4).tolist(),
                                 seeds=[1, 2], steps=0)
    with pytest.raises(TypeError, match=r"^specula: candidates must be .*not list"):
        specula.verify_candidates(p[:, 0], [[0], [1]], seeds=[1, 2], steps=0)
    with pytest.raises(TypeError, match=r"^specula: logits must be .*not list"):
        specula.logits_to_probs([[0.0, 1.0]])


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_float_cu_num_draft_tokens(framework):
    if framework == "torch" and torch is None:
        pytest.skip("torch is not installed")
    tokens = np.zeros(2, np.int32)
    target = np.full((4, 4), 0.25, np.float32)
    cu = np.array([1.0, 2.0], np.float32)
    if framework == "torch":
        tokens, target, cu = torch.from_numpy(tokens), torch.from_numpy(target), torch.tensor(cu)
    with pytest.raises(TypeError, match=r"^specula: cu_num_draft_tokens must have dtype int32 or "
                                        r"int64 \(got float32\)"):
        specula.rejection_sample(tokens, cu, None, target, seeds=[1, 2], steps=0)


def test_big_endian_and_read_only_arrays():
    q, d, p = chain_args()
    with pytest.raises(TypeError, match=r"^specula: target_probs has non-native byte order "
                                        r"\(dtype >f4\)"):
        call(q, d, p.astype(">f4"))
    ro = p.copy()
    ro.flags.writeable = False
    call(q, d, ro)  # inputs are only read
    out = np.zeros((2, 3), np.int32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"^specula: output_token_ids is read-only, but it is an "
                                         r"output"):
        call(q, d, p, output_token_ids=out)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_meta_tensors():
    q, d, p = chain_args()
    with pytest.raises(ValueError, match=r"^specula: target_probs is a meta tensor \(it has no "
                                         r"data\)"):
        call(torch.from_numpy(q), torch.from_numpy(d), torch.empty(2, 3, 4, device="meta"))


def test_batch_mismatch_is_named_before_the_seeds():
    q, d, p = chain_args()
    p3 = np.full((3, 3, 4), 0.25, np.float32)
    with pytest.raises(ValueError, match=r"^specula: target_probs has shape \(3, 3, 4\), but "
                                         r"draft_token_ids has B = 2 requests of L = 2 drafts: "
                                         r"target_probs must have shape \(2, 3, V\) or \(6, V\)"):
        call(q, d, p3, seeds=[1, 2, 3])
    with pytest.raises(ValueError, match=r"^specula: draft_probs has shape \(3, 2, 4\)"):
        call(np.full((3, 2, 4), 0.25, np.float32), d, p, seeds=[1, 2, 3])
    with pytest.raises(ValueError, match=r"^specula: target_probs has 3 rows, but candidates has "
                                         r"B = 2 requests"):
        specula.verify_candidates(np.full((3, 4), 0.25, np.float32), np.zeros((2, 1), np.int32),
                                  seeds=[1, 2, 3], steps=0)
    with pytest.raises(ValueError, match=r"^specula: target_probs has 3 rows, but the trees have "
                                         r"4 nodes"):
        specula.verify_tree(np.array([[-1, 0], [-1, 0]]), np.array([[-1, 1], [-1, 1]]),
                            np.full((3, 4), 0.25, np.float32), seeds=[1, 2, 3], steps=0)


def test_int64_token_id_outside_int32_names_its_value():
    q, d, p = chain_args()
    d64 = d.astype(np.int64)
    d64[1, 0] = 5_000_000_000
    with pytest.raises(ValueError, match=r"^specula: draft_token_ids\[1, 0\] = 5000000000 is not "
                                         r"a token id: ids must be in \[0, vocab_size\) \(32-bit\)"):
        call(q, d64, p)
    with pytest.raises(ValueError, match=r"^specula: draft_token_ids\[3\] = -4294967296 is not"):
        specula.rejection_sample(np.array([0, 0, 0, -2**32]), np.array([2, 4]), None,
                                 np.full((6, 4), 0.25, np.float32), seeds=[1, 2], steps=0)
