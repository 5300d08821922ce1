"""Webhooks: a transport that POSTs each message, signed, to the HTTP endpoint its destination names."""
