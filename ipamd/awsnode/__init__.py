"""What ipamd shares with aws-node (the AWS VPC CNI's daemon) on a node: its checkpoint, read to take
a running node over and kept current so that aws-node can take it back."""
