"""``fdsl rules [--check] [FILES]``: list the rules, or check each numerically against its
sides' values at random points."""

from __future__ import annotations

from ..base.errors import FdslError, say


def _cmd_rules(args) -> int:
    from ..verify.check import check, rules_to_check

    if args.trials < 1:
        raise FdslError("--trials must be at least 1")
    if args.check:
        return check(args.files, args.trials, args.seed)
    from ..lang.program import Program

    program = Program("<rules>")
    rules = rules_to_check(program, args.files)
    for r in rules:
        say("%-10s %s  (%s)" % (r.ruleset, r, r.where()))
    return 0


def register(sub):
    p = sub.add_parser("rules", help="list rules, or check them numerically (--check)")
    p.add_argument("files", nargs="*", metavar="FILE", help="rule files, loaded on top of the stdlib "
                   "(default: the stdlib's own rules)")
    p.add_argument("--check", action="store_true", help="evaluate both sides of every rule on random "
                   "instances of consistent shapes; exit 1 if any rule is unsound")
    p.add_argument("--trials", type=int, default=20, metavar="N", help="random instances per rule (default 20)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.set_defaults(func=_cmd_rules)
