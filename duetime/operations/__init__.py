"""What an operator does to messages from the command line and the dashboard: reading message
files, retrying and discarding what is in the error queue.
"""
