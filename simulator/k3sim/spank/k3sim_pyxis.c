/*
 * k3sim_pyxis: the simulated cluster's stand-in for NVIDIA's pyxis, a SPANK plugin of Slurm.
 *
 * Built by `k3deploy sim up --slurm` on the control host against Debian's libslurm-dev (slurm/spank.h, Slurm
 * 22.05, the nodes' own version) and loaded by every node's slurmd and srun through /etc/slurm/plugstack.conf.
 *
 * It adds to srun the options of pyxis that k3deploy's steps use, under pyxis's names and argument forms
 * (github.com/NVIDIA/pyxis, README "Usage" and args.c, release 0.24.0): --container-image, --container-mounts,
 * --container-name, --container-workdir, --container-env, --[no-]container-mount-home,
 * --[no-]container-entrypoint, --container-writable, --container-readonly, --[no-]container-remap-root.
 *
 * In each task of a step that names an image, in slurm_spank_task_init (in slurmstepd's child: the job's
 * process tree, as the job's user, with the task's environment: Slurm's CUDA_VISIBLE_DEVICES from the job's GRES),
 * it hands the task to the simulated enroot:
 *
 *     enroot start --image FILE [--name NAME] [--workdir DIR] [--mount SRC:DST[:FLAGS]]... -- ARGV...
 *
 * which checks the image file and runs the task's command "inside" it (node tool /usr/bin/enroot,
 * /usr/lib/k3sim/enrootsim.py). Nothing is mounted or unshared: the container is the task's own process.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(k3sim_pyxis, 1);

#define ENROOT "/usr/bin/enroot"
#define MAX_ARGS 256

static char *image;
static char *mounts;
static char *name;
static char *workdir;
static char *envs;
static int mount_home = -1;
static int entrypoint = -1;
static int writable = -1;
static int remap_root = -1;

static char *keep(const char *arg)
{
	return arg != NULL ? strdup(arg) : NULL;
}

static int opt_image(int val, const char *arg, int remote) { free(image); image = keep(arg); return 0; }
static int opt_mounts(int val, const char *arg, int remote) { free(mounts); mounts = keep(arg); return 0; }
static int opt_name(int val, const char *arg, int remote) { free(name); name = keep(arg); return 0; }
static int opt_workdir(int val, const char *arg, int remote) { free(workdir); workdir = keep(arg); return 0; }
static int opt_env(int val, const char *arg, int remote) { free(envs); envs = keep(arg); return 0; }
static int opt_home(int val, const char *arg, int remote) { mount_home = val; return 0; }
static int opt_entry(int val, const char *arg, int remote) { entrypoint = val; return 0; }
static int opt_writable(int val, const char *arg, int remote) { writable = val; return 0; }
static int opt_remap(int val, const char *arg, int remote) { remap_root = val; return 0; }

struct spank_option spank_options[] = {
	{"container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
	 "[pyxis] the image to use for the container filesystem (k3sim: a squashfs file made by enroot import)",
	 1, 0, opt_image},
	{"container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]", "[pyxis] bind mount[s] inside the container", 1, 0,
	 opt_mounts},
	{"container-workdir", "PATH", "[pyxis] working directory inside the container", 1, 0, opt_workdir},
	{"container-name", "NAME", "[pyxis] name to use for saving and loading the container on the host", 1, 0,
	 opt_name},
	{"container-env", "NAME[,NAME...]", "[pyxis] names of environment variables to override with the host's", 1,
	 0, opt_env},
	{"container-mount-home", NULL, "[pyxis] bind mount the user's home directory", 0, 1, opt_home},
	{"no-container-mount-home", NULL, "[pyxis] do not bind mount the user's home directory", 0, 0, opt_home},
	{"container-entrypoint", NULL, "[pyxis] execute the entrypoint from the container image", 0, 1, opt_entry},
	{"no-container-entrypoint", NULL, "[pyxis] do not execute the entrypoint from the container image", 0, 0,
	 opt_entry},
	{"container-writable", NULL, "[pyxis] make the container filesystem writable", 0, 1, opt_writable},
	{"container-readonly", NULL, "[pyxis] make the container filesystem read-only", 0, 0, opt_writable},
	{"container-remap-root", NULL, "[pyxis] ask to be remapped to root inside the container", 0, 1, opt_remap},
	{"no-container-remap-root", NULL, "[pyxis] do not remap to root inside the container", 0, 0, opt_remap},
	SPANK_OPTIONS_TABLE_END
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	return 0;
}

/* enroot start's argv for this task: the image, the container's settings, "--", then the task's own argv */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	char *argv[MAX_ARGS];
	int n = 0, task_argc = 0, i;
	char **task_argv = NULL, **task_env = NULL;
	char *copy, *save = NULL, *one;

	if (image == NULL || !spank_remote(sp))
		return 0;
	if (spank_get_item(sp, S_JOB_ARGV, &task_argc, &task_argv) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ENV, &task_env) != ESPANK_SUCCESS) {
		slurm_error("pyxis: cannot read the task's command and environment");
		return -1;
	}
	argv[n++] = ENROOT;
	argv[n++] = "start";
	argv[n++] = "--image";
	argv[n++] = image;
	if (name != NULL) {
		argv[n++] = "--name";
		argv[n++] = name;
	}
	if (workdir != NULL) {
		argv[n++] = "--workdir";
		argv[n++] = workdir;
	}
	if (envs != NULL) {
		argv[n++] = "--env";
		argv[n++] = envs;
	}
	if (writable == 1)
		argv[n++] = "--rw";
	if (mount_home != 0)
		argv[n++] = "--mount-home";
	if (entrypoint == 1)
		argv[n++] = "--entrypoint";
	if (mounts != NULL) {
		copy = strdup(mounts);
		for (one = strtok_r(copy, ",", &save); one != NULL && n < MAX_ARGS - 8; one = strtok_r(NULL, ",", &save)) {
			argv[n++] = "--mount";
			argv[n++] = one;
		}
	}
	argv[n++] = "--";
	for (i = 0; i < task_argc && n < MAX_ARGS - 1; i++)
		argv[n++] = task_argv[i];
	argv[n] = NULL;
	execve(ENROOT, argv, task_env);
	slurm_error("pyxis: cannot run %s: %s", ENROOT, strerror(errno));
	return -1;
}
