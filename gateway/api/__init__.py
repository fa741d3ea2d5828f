"""The API's bodies: request and response declarations, `/openapi.json`, answering and streaming."""
