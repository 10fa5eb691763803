"""Stand-in of ``vllm/v1/core/sched/utils.py::check_stop`` and ``remove_all``
(imported by scheduler.py@003df2961dd8830c317a61f9745ccd557da9fa06; not read).

Facts relied on: a request stops with FINISHED_LENGTH_CAPPED once
``num_tokens >= max_model_len`` or ``num_output_tokens >= max_tokens``
(EOS and stop tokens are not modelled: the toy model has no EOS).
"""

from vllm.v1.request import RequestStatus


def check_stop(request, max_model_len: int) -> bool:
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def remove_all(lst: list, items_to_remove: set) -> list:
    return [x for x in lst if x not in items_to_remove]
