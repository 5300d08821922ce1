"""`duetime dashboard`: see and steer delivery in a browser (needs ``duetime[dashboard]``).

:mod:`~duetime.dashboard.server` serves them as the command does, :mod:`~duetime.dashboard.app`
holds the pages and actions, :mod:`~duetime.dashboard.timeline`
what the charts remember, :mod:`~duetime.dashboard.charts` how they are drawn, and
:mod:`~duetime.dashboard.security` the login and CSRF checks.
"""
