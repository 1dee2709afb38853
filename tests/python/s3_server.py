"""S3 for the source tests: moto's server on a free loopback port, with one bucket, one object
(the bytes of the file named on the command line, at the key given), and an IAM user allowed to
read it. Requests after the setup must be signed with that user's keys, so wrong keys are
refused as by S3. Prints {"url", "key", "secret"} as one JSON line, then serves until stdin closes.

usage: s3_server.py BUCKET KEY FILE
"""
import json
import logging
import os
import sys

# Read by moto at import: the setup's own requests go unauthenticated, every later one is checked.
SETUP_REQUESTS = 5
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = str(SETUP_REQUESTS)

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402


def main():
    bucket, key, path = sys.argv[1:4]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    url = "http://127.0.0.1:%d" % server.get_host_and_port()[1]
    setup = dict(endpoint_url=url, region_name="us-east-1",
                 aws_access_key_id="setup", aws_secret_access_key="setup")
    s3, iam = boto3.client("s3", **setup), boto3.client("iam", **setup)
    s3.create_bucket(Bucket=bucket)
    with open(path, "rb") as f:
        s3.put_object(Bucket=bucket, Key=key, Body=f.read())
    iam.create_user(UserName="reader")
    policy = {"Version": "2012-10-17",
              "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(policy))
    access = iam.create_access_key(UserName="reader")["AccessKey"]
    print(json.dumps({"url": url, "key": access["AccessKeyId"],
                      "secret": access["SecretAccessKey"]}), flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
