/* The pod sandbox's process: sleeps until SIGINT/SIGTERM, reaps the zombies it inherits. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction on_quit = {.sa_handler = quit}, on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &on_quit, NULL) < 0 || sigaction(SIGTERM, &on_quit, NULL) < 0 ||
      sigaction(SIGCHLD, &on_child, NULL) < 0)
    return 1;
  for (;;) pause();
}
