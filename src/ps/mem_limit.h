/* The memory this process may use: the machine's physical memory, or less where a cgroup limits it
 * (a container: Kubernetes, Docker, a Slurm job with ConstrainRAMSpace). A ps sizes its default
 * table memory from it (dt_ps_table_memory_default), so that a ps in a container refuses tables
 * that would pass the container's limit instead of being killed by the kernel as they fill. */
#ifndef DT_PS_MEM_LIMIT_H
#define DT_PS_MEM_LIMIT_H

#include <stdint.h>

/* The least of `physical` and the memory limits of this process's cgroups, read below `root` ("" for
 * the real files): cgroup v2's memory.max of its cgroup and of every ancestor (a limit anywhere above
 * binds it too), cgroup v1's memory.limit_in_bytes of its memory cgroup. Files absent, unreadable or
 * not a number ("max": no limit) are no limit. */
uint64_t dt_mem_limit(const char *root, uint64_t physical);

#endif
