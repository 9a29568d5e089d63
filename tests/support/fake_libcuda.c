/*
 * An image-owned stand-in for libcuda.so.1. Its cuInit returns 999, a value no
 * real or simulated driver returns, so a test that sees 999 knows the image's
 * own library was loaded instead of the host driver's one nvhook injected.
 */
int cuInit(unsigned int flags)
{
    (void)flags;
    return 999;
}
