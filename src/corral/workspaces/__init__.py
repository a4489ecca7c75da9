"""The only ways into a task's ports and shell: the proxy of /w/NAME/PORT/ and workspace
origins, and exec (on this machine or relayed through a node's agent), each checked by
who may enter the workload and each session audited."""
