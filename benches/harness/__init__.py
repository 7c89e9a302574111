"""End-to-end overhead harness: simulated engines, a closed-loop streaming load generator,
Narwhal and the anchor routers measured side by side (``python -m benches.harness``)."""
