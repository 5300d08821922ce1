"""NServiceBus's timeout manager, as duetime plays it: the front door (``frontdoor``), which takes
delayed messages off an endpoint's timeouts queue. Its wire format (header names, dates) is
:mod:`duetime.nservicebus_wire`, in the core, since the message itself needs it.
"""
