"""The repl at a terminal: the prompt (prompt_toolkit, with completion, history and highlighting)
or, without a terminal, a script of inputs read from a stream; both feed one ``Session``."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..base.errors import FdslError
from .session import (
    BANNER,
    COMMANDS,
    CONTINUATION,
    PROMPT,
    Session,
    _op_signature,
    _operators,
    find_command,
    history_path,
    needs_more,
    private_folder,
)

# ---- completion ----------------------------------------------------------------------------------


def completion_names(program) -> dict[str, tuple[str, str]]:
    """Every name the session knows: text to insert -> (name, what it is). Keyed by the text, so
    the dim ``d`` and the operator ``d(`` are both offered."""
    from ..core.functions import FUNCTIONS
    names: dict[str, tuple[str, str]] = {}
    for name, op in _operators(program).items():
        names[name + "("] = (name, "operator " + _op_signature(op))
    for name, f in FUNCTIONS.items():
        names[name + "("] = (name, f.signature)
    book = program.rulebook
    if book is not None and hasattr(book, "ruleset_names"):
        for name in book.ruleset_names():
            names[name + "("] = (name, "ruleset")
    for name in program.dims:
        names[name] = (name, "dim")
    for name, fam in program.families.items():
        names[name + "["] = (name, "%s %s[%s]" % (fam.kind, name, ", ".join(fam.indices)))
    for name, term in program.symbols.items():
        names[name] = (name, term.data[0].kind if term.op == "sym" else "symbol")
    for name in program.definitions:
        names[name] = (name, "definition")
    for name, clauses in program.clauses.items():
        params = ", ".join(str(p) for p in clauses[-1].params)
        names[name + "("] = (name, "definition %s(%s)" % (name, params))
    return names


_KEYWORDS = ("dim", "const", "scalar", "weight")


def _make_completer(session):
    from prompt_toolkit.completion import Completer, Completion, PathCompleter
    from prompt_toolkit.document import Document

    paths = PathCompleter(expanduser=True)

    class FdslCompleter(Completer):
        """Tab: names the session knows, statement keywords, :commands and their arguments."""

        def get_completions(self, document, complete_event):
            before = document.text_before_cursor
            if before.lstrip().startswith(":") and "\n" not in before:
                yield from self._command(before.lstrip()[1:], complete_event)
                return
            line = document.current_line_before_cursor
            if line.count('"') % 2:
                return  # inside a string
            m = re.search(r"(?<![A-Za-z0-9_])[A-Za-z][A-Za-z0-9_]*$", line)
            if not m:
                return
            word = m.group(0)
            at_start = not line[:m.start()].strip() or line[:m.start()].rstrip().endswith(";")
            candidates = completion_names(session.program)
            if at_start:
                from ..lang.statements import STATEMENTS

                for kw in list(STATEMENTS) + list(_KEYWORDS):
                    candidates.setdefault(kw + " ", (kw, "statement"))
            for insert in sorted(candidates):
                name, meta = candidates[insert]
                if name.startswith(word):
                    yield Completion(insert, start_position=-len(word), display=insert, display_meta=meta)

        def _command(self, text, complete_event):
            word, space, arg = text.partition(" ")
            if not space:
                for name in COMMANDS:
                    if name.startswith(word):
                        yield Completion(":" + name + " ", start_position=-len(word) - 1,
                                         display=":" + name, display_meta=COMMANDS[name].doc)
                return
            try:
                cmd = find_command(word)
            except FdslError:
                return
            arg = arg.lstrip()
            if cmd.name == "load":
                yield from paths.get_completions(Document(arg, len(arg)), complete_event)
                return
            choices = {"trace": ("on", "off"), "pager": ("on", "off", "auto")}.get(cmd.name)
            if cmd.name == "rules":
                book = session.program.rulebook
                choices = tuple(book.ruleset_names()) if book is not None and hasattr(book, "ruleset_names") else ()
            elif cmd.name in ("help", "diagram"):
                choices = tuple(sorted({name for name, _ in completion_names(session.program).values()}))
            for choice in choices or ():
                if choice.startswith(arg):
                    yield Completion(choice, start_position=-len(arg))

    return FdslCompleter()


# ---- the two ways of reading input ---------------------------------------------------------------


def interactive(session: Session) -> None:
    """The prompt_toolkit loop: history, completion, multi-line input."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.enums import DEFAULT_BUFFER
    from prompt_toolkit.filters import has_focus
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings

    path = history_path()
    try:
        history = FileHistory(str(usable_history(path)))
    except (OSError, FdslError) as e:
        session._error("history will not be kept: cannot use %s (%s)" % (path, getattr(e, "strerror", None) or e))
        history = InMemoryHistory()

    keys = KeyBindings()

    @keys.add("enter", filter=has_focus(DEFAULT_BUFFER))  # not while Ctrl-R searches
    def _enter(event):
        buf = event.current_buffer
        if buf.complete_state is not None:  # Enter picks the highlighted completion
            buf.complete_state = None
            return
        text = buf.document.text
        cursor_on_blank_last_line = buf.document.is_cursor_at_the_end and "\n" in text \
            and not text.rsplit("\n", 1)[1].strip()
        if needs_more(text) and not cursor_on_blank_last_line:
            buf.insert_text("\n")
        else:
            buf.validate_and_handle()

    try:  # syntax highlighting of what is typed (Pygments); without it, plain text
        from prompt_toolkit.lexers import PygmentsLexer

        from ..lang.highlight import FdslLexer

        lexer = PygmentsLexer(FdslLexer)
    except ImportError:
        lexer = None
    prompt = PromptSession(history=history, completer=_make_completer(session), complete_while_typing=False,
                           lexer=lexer,
                           multiline=True, key_bindings=keys, enable_history_search=False,
                           prompt_continuation=lambda width, line, wrap: CONTINUATION)
    session.say(BANNER)
    while not session.done:
        try:
            session.run(prompt.prompt(PROMPT))
        except KeyboardInterrupt:
            continue  # Ctrl-C cancels what was being typed (session.run handles it during evaluation)
        except EOFError:
            break


def usable_history(path: Path) -> Path:
    """The history file, checked: a regular file of at most 16 MB (a FIFO would hang the prompt,
    ``/dev/zero`` fill the memory) or absent; its default folder is this user's own (0700)."""
    import stat

    if "FDSL_HISTORY" not in os.environ:
        private_folder(path.parent)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        path.touch(mode=0o600)
        return path
    if not stat.S_ISREG(st.st_mode):
        raise FdslError("it is not a regular file")
    if st.st_size > 16 << 20:
        raise FdslError("it is larger than 16 MB")
    return path


def script(session: Session, stream, filename: str = "<stdin>") -> None:
    """No terminal: read inputs line by line, no prompt, joining lines the way the prompt does;
    errors name the line of the stream where they are (``<stdin>:12:5``)."""
    pending, start = "", 1
    for number, line in enumerate(stream, 1):
        line = line.rstrip("\n")
        if pending and not line.strip():
            session.run(pending, start, filename)  # an empty line ends an incomplete input: show its error
            pending = ""
            continue
        if not pending:
            start = number
        pending = pending + "\n" + line if pending else line
        if not needs_more(pending):
            session.run(pending, start, filename)
            pending = ""
        if session.done:
            return
    if pending.strip():
        session.run(pending, start, filename)


# ---- fdsl repl -----------------------------------------------------------------------------------
