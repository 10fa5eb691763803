"""Stand-in of ``vllm/logger.py`` (003df29 era; not read: only its uses in
base.py and scheduler.py at 003df2961dd8830c317a61f9745ccd557da9fa06).

Facts relied on: connectors call ``init_logger(__name__)`` and use the
standard ``logging`` methods plus ``warning_once`` / ``info_once`` /
``debug_once`` (base.py@003df29 uses ``logger.warning`` and
``logger.debug``; scheduler.py@003df29 uses ``logger.debug_once``).
"""

import logging

_seen = set()


class _VllmLogger(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        return msg, kwargs

    def _once(self, level, msg, *args, **kwargs):
        key = (level, msg, args)
        if key in _seen:
            return
        _seen.add(key)
        self.log(level, msg, *args, **kwargs)

    def warning_once(self, msg, *args, **kwargs):
        self._once(logging.WARNING, msg, *args, **kwargs)

    def info_once(self, msg, *args, **kwargs):
        self._once(logging.INFO, msg, *args, **kwargs)

    def debug_once(self, msg, *args, **kwargs):
        self._once(logging.DEBUG, msg, *args, **kwargs)


def init_logger(name: str) -> _VllmLogger:
    return _VllmLogger(logging.getLogger(name), {})
