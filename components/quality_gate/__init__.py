"""quality-gate: the evaluate decision as a single-output task that `dsl.If` branches on."""
