"""The embedded cloud: moto's EC2 extended with the behaviour ipamd depends on (`moto_ext`), fault
injection on boto3 clients (`faults`), and a ready-made VPC, subnet and instance (`world`).

For tests and `ipamd run --embedded` only; the daemon proper never imports this package. Importing it is
cheap: moto is loaded by the modules that need it.
"""
