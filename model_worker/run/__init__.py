"""One analysis run: the orchestrator (`analyze`), its run state and final projector (`state`),
the queries and scores it reads from the model (`queries`), the factored unembedding of
recurring heads (`factored`; their cache is `model_worker.resources.unembedding_cache`), the
detailed
heads' stage (`details`) and the result assembly (`assembly`). The maths it calls is in
`model_worker.analysis`.
A method: imports model/, resources/, checks/, analysis/ and towers/; never service/."""
