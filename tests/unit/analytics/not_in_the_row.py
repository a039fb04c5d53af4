"""The fields of the hot path's messages that its rows do not carry (``test_bounds.py`` finds
them by probing every field, and checks that each is judged by its model)."""

#: Fields whose values the hot path's row does not carry (nested in a dispatched request, or
#: not stored), so that no column check can see a value out of their limits (``schema_version``
#: and ``type``, which the hot path checks before it builds a row, are left out). Their route
#: names each as ``unread`` (``analytics/rows.py``): a record that gives one otherwise than
#: its default is judged by its model.
NOT_IN_THE_ROW = {
    "dispatch": {"CancelRequest": {"attempt", "reason"},
                 "Dispatch": {f"request.{name}" for name in (
                     "block_size", "created_ms", "deadline_ms", "event_time_ms", "max_tokens",
                     "prefix_hashes", "prefix_hashes.0", "priority", "prompt_text",
                     "prompt_token_ids", "prompt_tokens", "reply_to", "schema_version", "step",
                     "steps_total", "ttft_slo_s", "type")} | {"stream_partition"}},
    "requests": {"InferenceRequest": {"prompt_text", "prompt_token_ids", "reply_to"}},
    "telemetry": {"Requeued": {"engine_failed"},
                  "WorkerStatus": {"generated_tokens", "itl_ms", "max_model_len",
                                   "prefill_backlog_tokens", "prefill_context_tokens",
                                   "prefilled_tokens", "reply_progress",
                                   "reply_progress.0.attempt", "reply_progress.0.request_id",
                                   "reply_progress.0.tokens_sent", "steps"}},
}
