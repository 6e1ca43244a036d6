"""The accelerator path on the CPU (`POLYJIT_INLINE_CPU=0`: programs on JAX's own
client, as on a GPU): device-resident inputs, dynamic-size outputs and chained
calls move no data through host memory, and calls run under
`jax.transfer_guard("disallow")` (polyjit's own transfers are explicit).

"No data through the host" is checked two ways at once: every host-to-device
transfer, explicit or not, is logged by JAX's transfer guard
(`"log_explicit"`, to the process's stderr) and only size scalars and small
integer size vectors may be among them, and every read of a device array into
host memory (`__array__`, `copy_to_host_async`) is counted. The path is chosen per `pj.jit` function's
programs and plans (the environment variable is read when they are made), so
`monkeypatch.setenv` selects it for one test.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._jax import registry
from polyjit._jit import resident
from call_paths import backend_compiles, path  # noqa: F401 (fixtures)


@pytest.fixture
def accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
  """The accelerator path, a shape's pad and slice programs compiled at its
  second call (`resident.RENT = 0`: by default its host round trips must
  first have cost a compile, hundreds of calls)."""
  monkeypatch.setenv("POLYJIT_INLINE_CPU", "0")
  monkeypatch.setattr(resident, "RENT", 0.0)
  resident.forget()
  yield
  resident.forget()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
  """The shapes of the device arrays read into host memory (while counting)."""
  seen: list[tuple[int, ...]] = []
  array_type = type(jnp.zeros(1))
  to_numpy, to_host = array_type.__array__, array_type.copy_to_host_async

  def counted_array(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    seen.append(tuple(self.shape))
    return to_numpy(self, *args, **kwargs)

  def counted_copy(self):  # type: ignore[no-untyped-def]
    seen.append(tuple(self.shape))
    return to_host(self)
  monkeypatch.setattr(array_type, "__array__", counted_array)
  monkeypatch.setattr(array_type, "copy_to_host_async", counted_copy)
  return seen


_UPLOAD = re.compile(r"host-to-device transfer: aval=ShapedArray\((?P<dtype>[a-z0-9]+)\[(?P<dims>[0-9,]*)\]")


def uploads(stderr: str) -> list[str]:
  """The uploads JAX's transfer guard logged, other than size scalars and
  small integer size vectors."""
  out = []
  for line in stderr.splitlines():
    if "host-to-device transfer" not in line:
      continue
    m = _UPLOAD.search(line)
    sizes = m is not None and m["dtype"].startswith("int") and (
        m["dims"] == "" or (m["dims"].isdigit() and int(m["dims"]) <= 8))
    if not sizes:
      out.append(line)
  return out


def _on_device(n: int, cols: int = 3, seed: int = 0) -> jax.Array:
  host = np.random.default_rng(seed + n).standard_normal((n, cols)).astype(np.float32)
  return jax.device_put(host)


SIZES = (3, 999, 100, 512, 40, 700)


def test_dynamic_outputs_and_device_inputs_stay_on_the_device(
    accelerator: None, reads: list, capfd: pytest.CaptureFixture[str]) -> None:
  f = pj.jit(lambda x: jnp.tanh(x) * 2.0)
  xs = {n: _on_device(n) for n in SIZES}
  for _ in range(5):  # new shapes: pad and slice programs made, sizes on the device
    for x in xs.values():
      f(x)
  reads.clear()
  outs = {}
  capfd.readouterr()
  with jax.transfer_guard("log_explicit"):  # every upload, explicit or not, is logged
    for n, x in xs.items():
      outs[n] = f(x)
  assert reads == []
  assert uploads(capfd.readouterr().err) == []
  for n, x in xs.items():
    assert isinstance(outs[n], jax.Array) and outs[n].shape == (n, 3)
    np.testing.assert_allclose(np.asarray(outs[n]), np.asarray(jax.jit(f.fun)(x)), rtol=1e-6)


def test_chained_calls_take_the_padded_buffer_as_it_lies(
    accelerator: None, reads: list, capfd: pytest.CaptureFixture[str]) -> None:
  f = pj.jit(lambda x: jnp.tanh(x)[:, :2] * 2.0, polymorphic_shapes=["(n, _)"],
             buckets=pj.buckets.PowersOfTwo())
  g = pj.jit(lambda y: jnp.sum(y * y, axis=0), polymorphic_shapes=["(n, _)"],
             buckets=pj.buckets.PowersOfTwo())
  xs = {n: _on_device(n) for n in SIZES}
  for _ in range(5):
    for x in xs.values():
      f(x)
  for n in SIZES:  # g's programs, compiled for padded arguments of its own
    g(jax.device_put(np.zeros((1 << (n - 1).bit_length(), 2), np.float32)))
  made = (set(resident._pads), set(resident._seen))
  reads.clear()
  capfd.readouterr()
  with jax.transfer_guard("log_explicit"):
    # g has never seen these shapes (f's outputs: (n, 2)): without f's padded
    # buffer each would be padded through the host (a first shape)
    got = {n: g(f(x)) for n, x in xs.items()}
  assert reads == []
  assert uploads(capfd.readouterr().err) == []
  assert (set(resident._pads), set(resident._seen)) == made  # no padding at all
  want = jax.jit(lambda x: jnp.sum((jnp.tanh(x)[:, :2] * 2.0) ** 2, axis=0))
  for n, out in got.items():
    np.testing.assert_allclose(np.asarray(out), np.asarray(want(xs[n])), rtol=1e-5)


def test_a_deleted_or_donated_output_is_refused_as_jax_jit_refuses_it(
    accelerator: None) -> None:
  # (its padded buffer is still kept for a chained call: taking it would
  # compute on an array the user deleted or donated)
  f = pj.jit(lambda x: x * 2.0, polymorphic_shapes=["n"])
  g = pj.jit(jnp.cumsum, polymorphic_shapes=["n"])
  donate = jax.jit(lambda y: y + 1.0, donate_argnums=0)
  for n in (3, 5, 6, 7):
    y = f(jnp.arange(n, dtype=jnp.float32))
    y.delete()
    with pytest.raises(RuntimeError, match="deleted"):
      g(y)
    z = f(jnp.arange(n, dtype=jnp.float32))
    donate(z)
    if z.is_deleted():  # (a backend that does not take the donation keeps z)
      with pytest.raises(RuntimeError, match="deleted"):
        g(z)


@pytest.mark.parametrize("host_value", ["array", "scalar"])
def test_a_host_argument_under_disallow_is_refused_as_jax_jit_refuses_it(
    path: str, host_value: str) -> None:
  # (polyjit uploads its padded copy explicitly: the user's own value is an
  # implicit transfer all the same, which jax.jit's guard refuses)
  f = pj.jit(lambda x, mu: jnp.sum(x * mu))
  for n in (5, 6, 9, 17):   # first calls, a compiled bucket, then hot calls
    f(jax.device_put(np.ones(n, np.float32)), jax.device_put(np.float32(2)))
  for n in (5, 6, 9, 17):
    x = np.ones(n, np.float32) if host_value == "array" else jax.device_put(np.ones(n, np.float32))
    mu = np.float32(2) if host_value == "scalar" else jax.device_put(np.float32(2))
    with jax.transfer_guard("disallow"):
      with pytest.raises(Exception, match="Disallowed host-to-device transfer"):
        jax.jit(f.fun)(x, mu)
      with pytest.raises(Exception, match="Disallowed host-to-device transfer"):
        f(x, mu)
    assert float(f(x, mu)) == 2.0 * n   # (no guard: as before)


def test_ten_sizes_under_disallow_run_exact_without_fallback(path: str) -> None:
  registry.forget()  # (the probes run again, under the user's guard)
  f = pj.jit(lambda x, mu: jnp.sum(-0.5 * (x - mu) ** 2, axis=0) - 0.5 * x.shape[0])
  sizes = (3, 999, 100, 512, 40, 700, 7, 300, 250, 60)  # (the range, 3..999)
  xs = [_on_device(n) for n in sizes]
  mu = jax.device_put(np.float32(0.3))
  before = backend_compiles()
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.FallbackWarning)
    with jax.transfer_guard("disallow"):
      outs = [f(x, mu) for x in xs]
  assert backend_compiles() - before <= 4
  assert f.stats.fallback_calls == 0
  ref = jax.jit(f.fun)
  for x, out in zip(xs, outs, strict=True):
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref(x, mu)), rtol=1e-5)


def test_dynamic_outputs_under_disallow(path: str) -> None:
  f = pj.jit(lambda x: jnp.cumsum(x, axis=0)[::-1])
  ref = jax.jit(f.fun)
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.FallbackWarning)
    for n in (3, 40, 41, 40, 40, 7, 41):
      x = _on_device(n)
      with jax.transfer_guard("disallow"):
        out = f(x)
      assert out.shape == (n, 3)
      np.testing.assert_allclose(np.asarray(out), np.asarray(ref(x)), rtol=1e-5)
  assert f.stats.fallback_calls == 0


def test_probes_tell_user_settings_from_a_changed_jax() -> None:
  for setting in (lambda: jax.transfer_guard("disallow"),
                  lambda: jax.default_device(jax.devices()[0]),
                  lambda: jax.enable_x64(True)):
    registry.forget()
    with setting():
      registry.require(registry.CALL)  # (raised JaxBoundaryError under the guard)


def test_a_long_run_of_new_sizes_compiles_no_pad_programs(accelerator: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
  # By default a shape's program is bought only once its round trips through
  # the host have cost a compile: sizes seen a few times each are served by
  # the host (explicitly), with no compile per shape, and exactly.
  monkeypatch.setattr(resident, "RENT", 1.0)
  f = pj.jit(lambda x: jnp.tanh(x) * 2.0, polymorphic_shapes=["(n, _)"],
             buckets=pj.buckets.PowersOfTwo())
  ref = jax.jit(f.fun)
  xs = [_on_device(n) for n in (40, 41, 42, 43, 44, 45)]
  f(xs[0])
  before = backend_compiles()
  with jax.transfer_guard("disallow"):
    outs = [f(x) for _ in range(3) for x in xs]
  assert backend_compiles() == before
  assert resident._pads == {} and resident._slices == {}
  for out, x in zip(outs, xs * 3, strict=True):
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref(x)), rtol=1e-6)


def test_a_shape_that_keeps_coming_back_buys_its_programs(accelerator: None,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          reads: list) -> None:
  monkeypatch.setattr(resident, "RENT", 1.0)
  # (a compile priced at a few round trips)
  monkeypatch.setattr(resident, "compile_seconds", lambda: 1e-3)
  f = pj.jit(lambda x: jnp.tanh(x) * 2.0, polymorphic_shapes=["(n, _)"],
             buckets=pj.buckets.PowersOfTwo())
  x = _on_device(40)
  for _ in range(1000):
    f(x)
    if resident._pads and resident._slices:
      break
  assert list(resident._pads) == [((40, 3), (64, 3), np.dtype(np.float32))]
  assert list(resident._slices) == [((64, 3), (40, 3), np.dtype(np.float32))]
  reads.clear()
  out = f(x)
  assert reads == []  # bought: nothing through the host
  np.testing.assert_allclose(np.asarray(out), np.tanh(np.asarray(x)) * 2, rtol=1e-6)


def test_a_guard_that_refuses_explicit_transfers_buys_the_programs(
    accelerator: None, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(resident, "RENT", 1.0)  # (a shape's second call goes through the host)
  f = pj.jit(lambda x: jnp.tanh(x) * 2.0, polymorphic_shapes=["(n, _)"],
             buckets=pj.buckets.PowersOfTwo())
  ref = jax.jit(f.fun)
  for n in (8, 30, 20, 20, 20, 20):  # programs, plans and sizes on the device, before the guard
    f(_on_device(n))
  x = _on_device(20)
  with jax.transfer_guard("disallow_explicit"):  # the round trip is refused: bought now
    out = f(x)
  assert ((20, 3), (32, 3), np.dtype(np.float32)) in resident._pads
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref(x)), rtol=1e-6)
