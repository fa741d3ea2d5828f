"""Who is calling: API key and admin token formats, the admin token file, the caller's context, prefix-cache scopes."""
