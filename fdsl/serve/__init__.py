"""``fdsl serve``: the manual's utility, a console in the browser.

The page (``static/``) is a command window, the results typeset above it (KaTeX, vendored in
``static/katex/`` with its licence), each command's error under it, pictures inline and the files
it wrote offered for download, and a grey box below for logs. The server
(``server.py``, the standard library's ``http.server``) answers only URLs with its token; each
page load is a session (``sessions.py``) with a worker process of its own (``worker.py``), the
repl's session fed input after input, confined to a folder of its own (``confine.py``).
"""

from .server import serve
from .sessions import Options

__all__ = ["serve", "Options"]
