"""Pictures: term graphs and dependency views, drawn with Graphviz."""
