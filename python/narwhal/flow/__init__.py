"""The request's journey: intake, admission wait, placement, engine attempts, relay, prefill leg."""
