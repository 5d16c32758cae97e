"""AWS for ipamd: the EC2 and IMDS ports, their adapters and the embedded cloud.

This package knows AWS and nothing of pods, pools or the datastore.
"""
