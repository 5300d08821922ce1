"""The engine: the dispatcher's loop and its parts (circuit breakers, deadlines, finding the message
that breaks a connection, observer hooks, the summary line). It receives stores and transports as
objects and never imports a backend.
"""
