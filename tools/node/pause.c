/* The pod sandbox's process (what the "pause" image runs): it holds the Pod's namespaces and
 * does nothing else until it is told to stop. No registry is reachable here, so hack/node.sh
 * builds this into a local FROM-scratch image and sets it as containerd's sandbox_image
 * (docs/testing.md, "The real node"). Static, no libc at run time. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction s = {0};
  s.sa_handler = stop;
  sigaction(SIGINT, &s, NULL);
  sigaction(SIGTERM, &s, NULL);
  s.sa_handler = reap;
  s.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &s, NULL);
  for (;;) pause();
  return 0;
}
