"""Issue 19 ("exact under a flood"): one uvicorn worker, 1,000 keep-alive connections, a real store."""
