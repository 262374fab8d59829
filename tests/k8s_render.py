"""Renders the pods of a Kubernetes manifest's Indexed Jobs as Kubernetes would start them, for
tests/test_managers.sh: for each Job and each completion index, one tab-separated line: the pod's
DNS name (<job>-<index>.<subdomain>, what a headless Service publishes), its TF_CONFIG and its
command and args (space-separated), with the completion-index annotation filled in and $(VAR) references expanded
as the kubelet does (a variable defined earlier in the list; $$ is a literal $; unknown stay)."""
import re
import sys

import yaml


def expand(text, env):
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, text)


def field_ref(path, index, job):
    if path == "metadata.annotations['batch.kubernetes.io/job-completion-index']":
        return str(index)
    if path == "metadata.name":
        return "%s-%d-xxxxx" % (job, index)
    raise SystemExit("unsupported fieldRef %s" % path)


for doc in yaml.safe_load_all(open(sys.argv[1])):
    if not doc or doc.get("kind") != "Job":
        continue
    spec, name = doc["spec"], doc["metadata"]["name"]
    if spec.get("completionMode") != "Indexed":
        raise SystemExit("job %s: not an Indexed Job" % name)
    pod = spec["template"]["spec"]
    for index in range(int(spec["completions"])):
        for c in pod["containers"]:
            env = {}
            for e in c.get("env", []):
                if "valueFrom" in e:
                    env[e["name"]] = field_ref(e["valueFrom"]["fieldRef"]["fieldPath"], index, name)
                else:
                    env[e["name"]] = expand(str(e.get("value", "")), env)
            argv = [expand(str(a), env) for a in c.get("command", []) + c.get("args", [])]
            if any(not a or " " in a or "\t" in a for a in argv):
                raise SystemExit("job %s: an empty argument or one with blanks" % name)
            print("%s-%d.%s\t%s\t%s" % (name, index, pod.get("subdomain", ""), env.get("TF_CONFIG", ""),
                                        " ".join(argv)))
