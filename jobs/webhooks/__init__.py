"""Webhooks: job and sweep events posted to the receivers owners subscribe, at least once.

events: which status change is which event, written to the SQL outbox in the transition's own transaction.
store: the webhooks and their deliveries. sender: the leased loop that fans the outbox out and posts.
post: one signed POST to an address checked by ssrf. formats: the bodies (json, slack) and the signature.
"""
