"""The OpenAI request and response bodies, each declared once as a pydantic v2 model.

- `fields`: the JSON scalar types the bodies are made of (an integer is not a boolean, 3.0 is 3);
- `requests`: `POST /v1/chat/completions` and `POST /v1/completions` bodies;
- `responses`: completions, streamed chunks, usage, models and errors, as the server answers them;
- `params`: a `ValidationError` as the 400 naming the field (`error.param`);
- `union_tags`: the discriminators of the bodies' tagged unions (by `type`, or a string or a list).

Validation, `/openapi.json` (`weir.gateway.api.openapi`) and the mapping to the engine's
`SamplingParams` (`weir.gateway.api.protocol`) derive from these models. The sampling bounds are those of
`weir.engine.sampling_bounds`, shared with the engine.
"""
