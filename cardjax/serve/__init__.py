"""`cardjax serve`: an OpenAI-compatible HTTP server over cardjax's batched decoders.

protocol.py parses and checks requests and shapes responses, engine.py holds the checkpoint
and runs one decode chunk, scheduler.py batches waiting requests between chunks, tau.py is
the load-aware MARS threshold, text.py turns tokens into streamed text, metrics.py the
Prometheus counters, app.py the routes and cli.py the command; pool/ holds the rows that
keep their KV cache between steps (continuous batching). docs/serving.md has the design
and the API."""
