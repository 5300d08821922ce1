"""NServiceBus, exactly: its headers on the wire (``headers``) and the timeout manager's front door
(``frontdoor``), which takes delayed messages off an endpoint's timeouts queue.
"""
