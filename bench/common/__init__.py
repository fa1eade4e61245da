"""What every benchmark family shares: Markdown tables, figures, process CPU accounting and the folders."""
