/*
 * log.h - owns how Guanaco talks to the user: one prefix ("guanaco: "), info
 * lines that GUANACO_LOG=0 silences, and errors that are never silenced.
 */
#ifndef GUANACO_LOG_H
#define GUANACO_LOG_H

#include <stdbool.h>

void guanaco_log_set_enabled(bool enabled);
bool guanaco_log_enabled(void);

__attribute__((format(printf, 1, 2))) void guanaco_log_info(const char *format, ...);
__attribute__((format(printf, 1, 2))) void guanaco_log_error(const char *format, ...);

/* Long work (the preload, a prompt that reads many GB) shows one line on a terminal, rewritten in place
   at most 4 times a second; guanaco_log_progress_end clears it, and any other line clears it first.
   Nothing at all when stderr is not a terminal or GUANACO_LOG=0, so logs and pipes stay clean. */
__attribute__((format(printf, 1, 2))) void guanaco_log_progress(const char *format, ...);
void guanaco_log_progress_end(void);

#endif
