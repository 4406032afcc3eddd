/*
 * enosys PROGRAM [ARGS...]: run PROGRAM with the x86_64 system calls statx and faccessat2 failing
 * with ENOSYS, for it and everything it starts (a seccomp filter is inherited across fork and
 * exec). tests/emulated.py puts it in front of proot, which runs an aarch64 root under qemu:
 * Debian's proot 5.1.0 does not translate the paths of these two calls, which qemu passes
 * through, so they would read the host's files. On ENOSYS glibc falls back to newfstatat and
 * faccessat, which proot translates.
 *
 * Raw BPF through prctl, so that no libseccomp headers are needed: cc enosys.c -o enosys
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>

#define X86_64_STATX 332
#define X86_64_FACCESSAT2 439

int main(int argc, char **argv) {
    struct sock_filter filter[] = {
        /* Another ABI numbers its calls otherwise: let it be. */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, X86_64_STATX, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, X86_64_FACCESSAT2, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
    };
    struct sock_fprog program = {sizeof filter / sizeof filter[0], filter};
    if (argc < 2) {
        fprintf(stderr, "usage: %s PROGRAM [ARGS...]\n", argv[0]);
        return 2;
    }
    /* Without no_new_privs only a process with CAP_SYS_ADMIN may install a filter. */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
        perror("enosys: seccomp");
        return 126;
    }
    execvp(argv[1], argv + 1);
    perror(argv[1]);
    return 127;
}
