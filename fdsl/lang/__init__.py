"""The language: parse (grammar/*.lark with Lark), hints (what a mistake probably meant), rules
(rule files and the rule book), statements, program (elaboration, shapes, the one normal-form
policy), listing (a program's display) and highlight (the Pygments lexer)."""
