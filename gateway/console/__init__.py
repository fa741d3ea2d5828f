"""The admin console in the browser, under /admin/ui (issue 26).

Server-rendered pages (Jinja2, autoescaped) over the same repository and rollout objects the
admin API uses, called in-process. A console session is a server-side record behind an
HttpOnly, SameSite=Strict cookie; every state-changing form carries the session's CSRF token.
"""
