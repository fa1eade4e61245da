"""Real traces through the product: the paper's workflows on each model of a real pool, verified, exported."""
