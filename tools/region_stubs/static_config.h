/* Stand-in for HAMi-core's CMake-made static_config.h: build switches and
 * the git hash, none of which changes the region's layout. */
