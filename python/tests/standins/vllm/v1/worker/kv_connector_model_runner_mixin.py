"""Stand-in of ``vllm/v1/worker/kv_connector_model_runner_mixin.py`` (the
003df29-era order; facts §6a: index 60181910953, a pre-refactor copy).

Facts relied on:
* ``_get_kv_connector_output(scheduler_output, wait_for_save=True)``, a
  context manager run inside the forward context: ``output =
  KVConnectorOutput()``; ``kv_connector = get_kv_transfer_group()``;
  assert KVConnectorBase_V1 and ``scheduler_output.kv_connector_metadata is
  not None``; **``bind_connector_metadata(meta)``**; **``start_load_kv(
  get_forward_context())``** before the forward; ``yield output`` (the forward
  and its per-layer hooks run here); then **``wait_for_save()``** (if
  wait_for_save), **``get_finished(scheduler_output.finished_req_ids)``** ->
  (finished_sending, finished_recving), **``get_block_ids_with_load_errors()``**,
  ``get_kv_connector_stats()``, ``get_kv_connector_kv_cache_events()``,
  **``build_connector_worker_meta()``**, **``clear_connector_metadata()``**.
* ``maybe_get_kv_connector_output`` is a no-op context without a connector.
* ``kv_connector_no_forward(scheduler_output, vllm_config)``, used when a step
  schedules no tokens: ``set_forward_context(None, vllm_config)`` and the
  above with ``wait_for_save=False`` and an empty body (so ``start_load_kv``
  sees ``attn_metadata is None``).
* The per-layer hook (``maybe_transfer_kv_layer``, facts §6b): no connector,
  or ``attn_metadata is None``, or ``not connector.has_connector_metadata()``
  -> plain attention; else **``wait_for_layer_load(layer_name)``** ->
  attention (writes this step's K/V) -> **``save_kv_layer(layer_name,
  kv_cache, attn_metadata)``** with the tensor registered for that layer and
  that layer's metadata.

``self.connector_calls`` (stand-in) records the worker-side calls in order.
"""

import contextlib

from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.forward_context import get_forward_context, set_forward_context
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput


class KVConnectorModelRunnerMixin:
    connector_calls: list

    def _wlog(self, name: str, detail=None) -> None:
        self.connector_calls.append((name, detail))

    @contextlib.contextmanager
    def _get_kv_connector_output(self, scheduler_output, wait_for_save: bool = True):
        output = KVConnectorOutput()
        kv_connector = get_kv_transfer_group()
        assert isinstance(kv_connector, KVConnectorBase_V1)
        assert scheduler_output.kv_connector_metadata is not None
        kv_connector.bind_connector_metadata(scheduler_output.kv_connector_metadata)
        self._wlog("bind_connector_metadata")
        kv_connector.start_load_kv(get_forward_context())
        self._wlog("start_load_kv")
        try:
            yield output
        finally:
            if wait_for_save:
                kv_connector.wait_for_save()
                self._wlog("wait_for_save")
            output.finished_sending, output.finished_recving = kv_connector.get_finished(
                scheduler_output.finished_req_ids)
            self._wlog("get_finished", set(scheduler_output.finished_req_ids))
            output.invalid_block_ids = set(kv_connector.get_block_ids_with_load_errors() or ())
            self._wlog("get_block_ids_with_load_errors", set(output.invalid_block_ids))
            output.kv_connector_stats = kv_connector.get_kv_connector_stats()
            output.kv_cache_events = kv_connector.get_kv_connector_kv_cache_events()
            output.kv_connector_worker_meta = kv_connector.build_connector_worker_meta()
            self._wlog("build_connector_worker_meta")
            kv_connector.clear_connector_metadata()
            self._wlog("clear_connector_metadata")

    def maybe_get_kv_connector_output(self, scheduler_output):
        if has_kv_transfer_group():
            return self._get_kv_connector_output(scheduler_output)
        return contextlib.nullcontext()

    def kv_connector_no_forward(self, scheduler_output, vllm_config) -> ModelRunnerOutput:
        with set_forward_context(None, vllm_config), \
                self._get_kv_connector_output(scheduler_output, wait_for_save=False) as kv_connector_output:
            pass
        return ModelRunnerOutput(kv_connector_output=kv_connector_output)

    def maybe_transfer_kv_layer(self, layer_name: str, attention, *args):
        """The per-layer hook around the attention op."""
        if not has_kv_transfer_group():
            return attention(*args)
        connector = get_kv_transfer_group()
        if not isinstance(connector, KVConnectorBase_V1):
            return attention(*args)
        ctx = get_forward_context()
        attn_metadata = ctx.attn_metadata
        if isinstance(attn_metadata, dict):
            attn_metadata = attn_metadata[layer_name]
        kv_cache = ctx.no_compile_layers[layer_name].kv_cache
        if attn_metadata is None or not connector.has_connector_metadata():
            return attention(*args)
        connector.wait_for_layer_load(layer_name)
        self._wlog("wait_for_layer_load", layer_name)
        result = attention(*args)
        connector.save_kv_layer(layer_name, kv_cache, attn_metadata)
        self._wlog("save_kv_layer", layer_name)
        return result
